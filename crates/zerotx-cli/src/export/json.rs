//! JSON: the whole report, every run included.

use crate::bench::result::Report;

/// Pretty-printed JSON.
pub fn render(report: &Report) -> serde_json::Result<String> {
    serde_json::to_string_pretty(report)
}
