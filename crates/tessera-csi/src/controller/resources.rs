//! The mount daemon's CPU and memory from StorageClass parameters, with no I/O:
//! `mountCPURequest`, `mountCPULimit`, `mountMemoryRequest`, `mountMemoryLimit`, each
//! a quantity within the bounds of [`tessera_api::MountResources`], a request never
//! above its limit. The result is recorded on the Volume (`spec.mountResources`).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use tessera_api::{self as api, MountResources, cpu_millis, memory_bytes};

use super::Error;
use crate::shown;

/// The parameter keys this module reads.
pub const KEYS: [&str; 4] = [
    "mountCPURequest",
    "mountCPULimit",
    "mountMemoryRequest",
    "mountMemoryLimit",
];

/// Set the amount `key` names to `value`; `Ok(false)` when `key` is none of [`KEYS`].
pub fn set(out: &mut MountResources, key: &str, value: &str) -> Result<bool, Error> {
    let (key, cpu, request): (&'static str, bool, bool) = match key {
        "mountCPURequest" => (KEYS[0], true, true),
        "mountCPULimit" => (KEYS[1], true, false),
        "mountMemoryRequest" => (KEYS[2], false, true),
        "mountMemoryLimit" => (KEYS[3], false, false),
        _ => return Ok(false),
    };
    let bad = |message: String| Error::MountResource { key, message };
    if cpu {
        cpu_millis(value).map_err(|e| bad(e.to_string()))?;
    } else if memory_bytes(value).is_none() {
        return Err(bad(format!(
            "{:?} is not an amount of memory from 16Mi to 64Gi (like 64Mi or 1Gi)",
            shown(value)
        )));
    }
    let amounts = if request {
        &mut out.requests
    } else {
        &mut out.limits
    };
    let slot = if cpu {
        &mut amounts.cpu
    } else {
        &mut amounts.memory
    };
    *slot = Some(Quantity(value.to_string()));
    Ok(true)
}

/// Check that no request exceeds its limit (both set), once every key is read; `None`
/// when nothing was set.
pub fn finish(r: MountResources) -> Result<Option<MountResources>, Error> {
    let amount = |q: &Option<Quantity>, cpu: bool| {
        q.as_ref().and_then(|q| {
            if cpu {
                cpu_millis(&q.0).ok()
            } else {
                api::memory_bytes(&q.0)
            }
        })
    };
    for (cpu, key) in [(true, KEYS[0]), (false, KEYS[2])] {
        let (req, lim) = if cpu {
            (&r.requests.cpu, &r.limits.cpu)
        } else {
            (&r.requests.memory, &r.limits.memory)
        };
        if let (Some(a), Some(b)) = (amount(req, cpu), amount(lim, cpu))
            && a > b
        {
            return Err(Error::MountResource {
                key,
                message: format!(
                    "the request {} is above the limit {}",
                    req.as_ref().map(|q| q.0.as_str()).unwrap_or_default(),
                    lim.as_ref().map(|q| q.0.as_str()).unwrap_or_default()
                ),
            });
        }
    }
    Ok((!r.is_empty()).then_some(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(kv: &[(&str, &str)]) -> Result<Option<MountResources>, Error> {
        let mut r = MountResources::default();
        for (k, v) in kv {
            assert!(set(&mut r, k, v)?, "{k} is a resource key");
        }
        finish(r)
    }

    #[test]
    fn parameters_become_requests_and_limits() {
        assert_eq!(parse(&[]).unwrap(), None);
        let r = parse(&[
            ("mountCPURequest", "50m"),
            ("mountCPULimit", "1"),
            ("mountMemoryRequest", "32Mi"),
            ("mountMemoryLimit", "256Mi"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(r.requests.cpu, Some(Quantity("50m".into())));
        assert_eq!(r.limits.cpu, Some(Quantity("1".into())));
        assert_eq!(r.requests.memory, Some(Quantity("32Mi".into())));
        assert_eq!(r.limits.memory, Some(Quantity("256Mi".into())));
        let only = parse(&[("mountMemoryLimit", "64Mi")]).unwrap().unwrap();
        assert!(only.requests.is_empty() && only.limits.cpu.is_none());
        assert!(!set(&mut MountResources::default(), "backendRoot", "/x").unwrap());
    }

    #[test]
    fn bad_amounts_are_refused_with_their_key() {
        for (kv, key) in [
            (vec![("mountMemoryLimit", "8Mi")], "mountMemoryLimit"),
            (vec![("mountMemoryLimit", "65Gi")], "mountMemoryLimit"),
            (vec![("mountMemoryRequest", "lots")], "mountMemoryRequest"),
            (vec![("mountCPULimit", "0")], "mountCPULimit"),
            (vec![("mountCPURequest", "100")], "mountCPURequest"),
            (
                vec![("mountMemoryRequest", "1Gi"), ("mountMemoryLimit", "64Mi")],
                "mountMemoryRequest",
            ),
            (
                vec![("mountCPURequest", "2"), ("mountCPULimit", "500m")],
                "mountCPURequest",
            ),
        ] {
            match parse(&kv) {
                Err(Error::MountResource { key: k, message }) => {
                    assert_eq!(k, key, "{kv:?}: {message}");
                    assert_eq!(
                        tonic::Status::from(Error::MountResource { key: k, message }).code(),
                        tonic::Code::InvalidArgument
                    );
                }
                other => panic!("{kv:?}: {other:?}"),
            }
        }
        let long = "9".repeat(5000);
        match parse(&[("mountMemoryLimit", &long)]) {
            Err(Error::MountResource { message, .. }) => assert!(message.len() < 400),
            other => panic!("{other:?}"),
        }
    }
}
