//! JSON: the whole report, every run included.

use super::Exporter;
use crate::bench::result::Report;

/// Pretty-printed JSON.
pub struct Json;

impl Exporter for Json {
    fn render(&self, report: &Report) -> anyhow::Result<Vec<u8>> {
        let mut v = serde_json::to_vec_pretty(report)?;
        v.push(b'\n');
        Ok(v)
    }
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
