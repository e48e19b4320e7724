//! Exporters: each renders the one [`Report`](crate::bench::result::Report) type.

pub mod csv;
pub mod json;
pub mod svg;
pub mod table;

/// `65536` -> `64K`, `1048576` -> `1M`, `1400` -> `1400`.
pub fn size_label(size: usize) -> String {
    if size >= 1 << 20 && size % (1 << 20) == 0 {
        format!("{}M", size >> 20)
    } else if size >= 1024 && size % 1024 == 0 {
        format!("{}K", size >> 10)
    } else {
        size.to_string()
    }
}
