//! Kubernetes quantities of bytes: parsed as the quota to enforce, and written back
//! in the shortest exact form.

/// A quantity that is not a whole, non-negative number of bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a quantity of bytes (like 10Gi, 500M or 1073741824)")]
pub struct QuantityError(pub String);

/// Bytes in a Kubernetes quantity (`10Gi`, `500M`, `1.5Gi`, `1e9`), rounded up to a
/// whole byte, as the quota to enforce.
pub fn quantity_bytes(q: &str) -> Result<u64, QuantityError> {
    let err = || QuantityError(q.to_string());
    let s = q.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let (mantissa, scale): (&str, f64) = match suffix {
        "" => (num, 1.0),
        "Ki" => (num, 1024.0),
        "Mi" => (num, 1024f64.powi(2)),
        "Gi" => (num, 1024f64.powi(3)),
        "Ti" => (num, 1024f64.powi(4)),
        "Pi" => (num, 1024f64.powi(5)),
        "Ei" => (num, 1024f64.powi(6)),
        "k" => (num, 1e3),
        "M" => (num, 1e6),
        "G" => (num, 1e9),
        "T" => (num, 1e12),
        "P" => (num, 1e15),
        "E" => (num, 1e18),
        "m" => (num, 1e-3),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().map_err(|_| err())?;
            (num, 10f64.powi(exp))
        }
        _ => return Err(err()),
    };
    if mantissa.is_empty() {
        return Err(err());
    }
    // Exact integer arithmetic where possible (the common case: "10Gi").
    if let (Ok(n), true) = (
        mantissa.parse::<u64>(),
        scale >= 1.0 && scale.fract() == 0.0,
    ) {
        return n.checked_mul(scale as u64).ok_or_else(err);
    }
    let v: f64 = mantissa.parse().map_err(|_| err())?;
    let bytes = (v * scale).ceil();
    if !(0.0..=(u64::MAX as f64)).contains(&bytes) {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// Bytes as the shortest exact quantity (`1Gi`, `500Mi`, `1000`), the inverse of
/// [`quantity_bytes`], so `kubectl get volumes` reads like the PVC that asked.
pub fn quantity_of(bytes: u64) -> String {
    for (suffix, unit) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_bytes() {
        for (q, want) in [
            ("1Gi", 1 << 30),
            ("10Gi", 10 << 30),
            ("500M", 500_000_000),
            ("1.5Gi", 3 << 29),
            ("1e3", 1000),
            ("1073741824", 1 << 30),
            ("100m", 1),
            ("2k", 2000),
        ] {
            assert_eq!(quantity_bytes(q), Ok(want), "{q}");
        }
        for bad in ["", "Gi", "1Zi", "abc", "-1Gi", "1..2"] {
            assert!(quantity_bytes(bad).is_err(), "{bad} must be rejected");
        }
    }

    #[test]
    fn quantities_from_bytes() {
        for (bytes, want) in [
            (1u64 << 30, "1Gi"),
            (3 << 29, "1536Mi"),
            (1000, "1000"),
            (0, "0"),
            (5 << 40, "5Ti"),
            (1 << 50, "1024Ti"),
        ] {
            assert_eq!(quantity_of(bytes), want, "{bytes}");
        }
        for bytes in [123_456_789, 1 << 30, 0, 1023, u64::MAX] {
            assert_eq!(quantity_bytes(&quantity_of(bytes)), Ok(bytes), "{bytes}");
        }
    }
}
