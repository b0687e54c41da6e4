//! The free space a node reports on its liveness Lease (annotation
//! [`ANNOTATION_FREE_BYTES`](crate::ANNOTATION_FREE_BYTES)), written by the node agent
//! and read by the CSI controller's GetCapacity: its format and its coarsening, pure.

use std::collections::BTreeMap;

/// At most this many roots are read from one report.
pub const MAX_ROOTS: usize = 32;

/// `bytes` with only its 7 highest bits kept (under 1.6 % lower): a report that moves
/// only when the free space really does, so neither the Lease's annotation nor the
/// CSIStorageCapacity objects change with every block written.
pub fn coarse(bytes: u64) -> u64 {
    let bits = 64 - bytes.leading_zeros();
    if bits <= 7 {
        return bytes;
    }
    let drop = bits - 7;
    (bytes >> drop) << drop
}

/// The free-bytes annotation of a node's Lease (`{"<root>": bytes}`).
pub fn free_annotation(free: &BTreeMap<String, u64>) -> String {
    serde_json::to_string(free).unwrap_or_else(|_| "{}".to_owned())
}

/// A free-bytes annotation read back; anything malformed or beyond
/// [`MAX_ROOTS`] roots reads as nothing known.
pub fn parse_free(s: &str) -> BTreeMap<String, u64> {
    if s.len() > 64 * 1024 {
        return BTreeMap::new();
    }
    match serde_json::from_str::<BTreeMap<String, u64>>(s) {
        Ok(m) if m.len() <= MAX_ROOTS => m,
        _ => BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coarse_keeps_seven_bits_and_never_rounds_up() {
        assert_eq!(coarse(0), 0);
        assert_eq!(coarse(127), 127);
        assert_eq!(coarse(128), 128);
        assert_eq!(coarse(129), 128);
        assert_eq!(coarse(u64::MAX), 0xfe00_0000_0000_0000);
        for b in [1_000u64, 10 << 30, 123_456_789_012, 987_654_321] {
            let c = coarse(b);
            assert!(c <= b && (b - c) * 64 <= b, "{b} -> {c}");
            assert_eq!(coarse(c), c, "stable");
        }
        // Small writes do not move it.
        let half = (100u64 << 30) + (512 << 20);
        assert_eq!(coarse(half), coarse(half - (64 << 20)));
    }

    #[test]
    fn the_annotation_round_trips_and_bounds_what_it_reads() {
        let m: BTreeMap<String, u64> = [("/a".to_owned(), 5), ("/b\"x".to_owned(), 7)].into();
        assert_eq!(parse_free(&free_annotation(&m)), m);
        assert!(parse_free("not json").is_empty());
        assert!(parse_free(r#"{"/a": -1}"#).is_empty());
        let many: BTreeMap<String, u64> = (0..=MAX_ROOTS).map(|i| (format!("/r{i}"), 1)).collect();
        assert!(parse_free(&free_annotation(&many)).is_empty());
    }
}
