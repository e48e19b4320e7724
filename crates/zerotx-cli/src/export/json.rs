//! JSON: the whole report, every run included, and per topology the zerotx / baseline ratios
//! the table shows (`baseline_ratios`: [`TopologyResult::paired`] for each pair and size), so a
//! script reads them instead of computing the statistic again.

use serde_json::json;

use super::Exporter;
use crate::bench::result::{Report, TopologyResult};

/// Pretty-printed JSON.
pub struct Json;

impl Exporter for Json {
    fn render(&self, report: &Report) -> anyhow::Result<Vec<u8>> {
        let mut v = serde_json::to_value(report)?;
        if let Some(topologies) = v["topologies"].as_array_mut() {
            for (j, t) in topologies.iter_mut().zip(&report.topologies) {
                j["baseline_ratios"] = baseline_ratios(t);
            }
        }
        let mut out = serde_json::to_vec_pretty(&v)?;
        out.push(b'\n');
        Ok(out)
    }
}

/// One entry per (zerotx engine, baseline, size) that both ran: the paired median, its 95%
/// interval (`null` below 6 repetitions) and the number of pairs.
fn baseline_ratios(t: &TopologyResult) -> serde_json::Value {
    let mut out = Vec::new();
    for (a, b) in t.baseline_pairs() {
        for &size in &t.sizes {
            if let Some(p) = t.paired(a, b, size) {
                out.push(json!({ "engine": a, "baseline": b, "size": size, "ratio": p }));
            }
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;

    #[test]
    fn every_cell_and_the_skip_reason_are_there() {
        let out = Json.render(&sample::report()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["topologies"][0]["cells"][1]["zerocopy"], 1000);
        assert_eq!(
            v["topologies"][0]["cells"][3]["error"],
            "engine unavailable"
        );
        assert_eq!(v["topologies"][1]["skipped"], "no vsock transport");
        assert_eq!(v["ring_bytes"], 32 << 20);
        assert_eq!(v["seed"], 0);
        assert_eq!(v["batch"], 32);
    }

    #[test]
    fn baseline_ratios_are_there_as_the_table_shows_them() {
        let out = Json.render(&sample::with_baselines()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let ratios = v["topologies"][0]["baseline_ratios"].as_array().unwrap();
        assert_eq!(ratios.len(), 4);
        let msg_zc = ratios.iter().find(|r| r["engine"] == "msg-zc").unwrap();
        assert_eq!(msg_zc["baseline"], "raw-msg-zc");
        assert_eq!(msg_zc["size"], 65000);
        assert_eq!(msg_zc["ratio"]["median"], 14000.0 / 16000.0);
        assert_eq!(msg_zc["ratio"]["pairs"], 1);
        assert!(msg_zc["ratio"]["interval"].is_null());
        // A report without baselines has an empty list.
        let plain = Json.render(&sample::report()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&plain).unwrap();
        assert_eq!(v["topologies"][0]["baseline_ratios"], serde_json::json!([]));
    }

    #[test]
    fn latency_an_engine_did_not_report_is_null() {
        let out = Json.render(&sample::with_baselines()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let cells = v["topologies"][0]["cells"].as_array().unwrap();
        let lib = cells
            .iter()
            .find(|c| c["engine"] == "liburing-zc-fixed")
            .unwrap();
        assert!(lib["p50_us"].is_null());
        assert_eq!(cells[0]["p50_us"], 10.0);
    }
}
