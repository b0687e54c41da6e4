//! The agent's per-mount FUSE metrics: on each scrape, the counters files of this
//! node's mount daemons (`<state>/mounts/<volume>.counters`, written by
//! [`tessera_fuse::contract::counters`]) are mapped read-only, read and encoded, labelled by
//! volume, node and the volume's claim (`pvc`, `pvc_namespace`: what the agent's
//! reconciles last read from the volume's MountPod, `metrics::objects::Claims`; empty
//! before or without one).
//!
//! ```text
//!  GET /metrics ─▶ MountCounters::encode ─▶ read_dir(<state>/mounts), *.counters,
//!                  at most MAX_FILES ─▶ fuse::contract::counters::read (4 KiB, layout
//!                  checked: this release's or v1) ─▶ tessera_fuse_* families
//! ```
//!
//! Nothing is cached between scrapes: a daemon the agent adopted after a restart is
//! read like one it started, and a mount's counters go with its state files. The
//! durations (`tessera_fuse_operation_seconds_total`, the histogram
//! `tessera_fuse_operation_duration_seconds`) come from files of this release's
//! layout; a daemon of the previous release (a v1 file, during an upgrade) shows its
//! counts without them.

use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};

use tessera_fuse::contract::counters::{self, BUCKETS_NS, ErrnoClass, Op, Snapshot, TIMED};
use tessera_runtime::metrics::objects::{Claims, MountLabels, claim_of};

/// At most this many counters files are read per scrape (a node serves far fewer
/// volumes; the bound keeps a scrape cheap whatever the directory holds).
pub const MAX_FILES: usize = 1024;

/// Labels of one mount and an operation kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    #[prometheus(flatten)]
    mount: MountLabels,
    op: &'static str,
}

/// Labels of one mount and an errno class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrnoLabels {
    #[prometheus(flatten)]
    mount: MountLabels,
    errno: &'static str,
}

/// A histogram read whole from a counters file.
#[derive(Debug)]
struct ConstHistogram {
    sum: f64,
    count: u64,
    /// Upper bound (seconds) and the count in that bucket alone, the last `+Inf`.
    buckets: Vec<(f64, u64)>,
}

impl ConstHistogram {
    /// From a timed kind's nanoseconds and buckets ([`counters::Durations`]).
    fn new(nanos: u64, buckets: &[u64; counters::N_BUCKETS]) -> Self {
        let bounds = BUCKETS_NS
            .iter()
            .map(|&ns| ns as f64 / 1e9)
            .chain([f64::INFINITY]);
        ConstHistogram {
            sum: nanos as f64 / 1e9,
            count: buckets.iter().sum(),
            buckets: bounds.zip(buckets.iter().copied()).collect(),
        }
    }
}

impl TypedMetric for ConstHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The collector registered in the agent's registry.
#[derive(Debug)]
pub struct MountCounters {
    dir: PathBuf,
    node: String,
    claims: Claims,
}

impl MountCounters {
    /// Read the counters files in `dir` (the state directory's `mounts`), for `node`,
    /// labelled with the volumes' claims in `claims`.
    pub fn new(dir: PathBuf, node: String, claims: Claims) -> Self {
        MountCounters { dir, node, claims }
    }
}

/// The volume a counters file is of: `<volume>.counters`, the volume an object name.
fn volume_of(path: &Path) -> Option<String> {
    if path.extension()? != "counters" {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    let ok = !stem.is_empty()
        && stem.len() <= 253
        && stem
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    ok.then(|| stem.to_owned())
}

/// Every readable counters file in `dir`, by volume (at most [`MAX_FILES`] looked at).
pub fn read_all(dir: &Path) -> Vec<(String, Snapshot)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Snapshot)> = entries
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            Some((volume_of(&path)?, path))
        })
        .take(MAX_FILES)
        .filter_map(|(volume, path)| match counters::read(&path) {
            Ok(Some(s)) => Some((volume, s)),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "counters file not read");
                None
            }
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Encode one family: a descriptor, then a sample per `(labels, metric)`.
fn family<L: EncodeLabelSet, M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: Vec<(L, M)>,
) -> Result<(), std::fmt::Error> {
    if samples.is_empty() {
        return Ok(());
    }
    let mut desc = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    for (labels, metric) in &samples {
        metric.encode(desc.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for MountCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mounts = read_all(&self.dir);
        let mount =
            |volume: &String| MountLabels::new(volume, &self.node, claim_of(&self.claims, volume));
        let mut ops = Vec::new();
        let mut seconds = Vec::new();
        let mut histograms = Vec::new();
        let mut errors = Vec::new();
        for (volume, s) in &mounts {
            let op_labels = |op: Op| OpLabels {
                mount: mount(volume),
                op: op.as_str(),
            };
            for (i, (op, n)) in Op::ALL.iter().zip(s.ops).enumerate() {
                if n > 0 {
                    ops.push((op_labels(*op), ConstCounter::new(n)));
                    if let Some(d) = &s.durations {
                        let secs = d.nanos[i] as f64 / 1e9;
                        seconds.push((op_labels(*op), ConstCounter::new(secs)));
                    }
                }
            }
            if let Some(d) = &s.durations {
                for (op, buckets) in TIMED.iter().zip(&d.buckets) {
                    if s.ops[*op as usize] > 0 {
                        let h = ConstHistogram::new(d.nanos[*op as usize], buckets);
                        histograms.push((op_labels(*op), h));
                    }
                }
            }
            for (class, n) in ErrnoClass::ALL.iter().zip(s.errors) {
                if n > 0 {
                    let labels = ErrnoLabels {
                        mount: mount(volume),
                        errno: class.as_str(),
                    };
                    errors.push((labels, ConstCounter::new(n)));
                }
            }
        }
        let per_mount = |f: fn(&Snapshot) -> u64| {
            mounts
                .iter()
                .map(|(v, s)| (mount(v), f(s)))
                .collect::<Vec<_>>()
        };
        let counter = |f: fn(&Snapshot) -> u64| {
            per_mount(f)
                .into_iter()
                .map(|(l, n)| (l, ConstCounter::new(n)))
                .collect::<Vec<_>>()
        };
        let gauge = |f: fn(&Snapshot) -> u64| {
            per_mount(f)
                .into_iter()
                .map(|(l, n)| (l, ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))))
                .collect::<Vec<_>>()
        };
        family(
            &mut encoder,
            "fuse_operations",
            "FUSE requests the mount daemon served, by kind",
            ops,
        )?;
        family(
            &mut encoder,
            "fuse_operation_seconds",
            "Seconds the mount daemon spent serving FUSE requests, by kind (mean: divide by \
             tessera_fuse_operations_total)",
            seconds,
        )?;
        family(
            &mut encoder,
            "fuse_operation_duration_seconds",
            "Time the mount daemon took to serve a FUSE request, from dispatch to reply, \
             for the kinds an application waits on",
            histograms,
        )?;
        family(
            &mut encoder,
            "fuse_errors",
            "FUSE requests answered with an error, by errno class",
            errors,
        )?;
        family(
            &mut encoder,
            "fuse_read_bytes",
            "Bytes the mount daemon read for the kernel (passthrough reads bypass it)",
            counter(|s| s.read_bytes),
        )?;
        family(
            &mut encoder,
            "fuse_written_bytes",
            "Bytes the mount daemon wrote (passthrough writes bypass it)",
            counter(|s| s.written_bytes),
        )?;
        family(
            &mut encoder,
            "fuse_quota_used_bytes",
            "Bytes in use on the volume, as its quota counts them",
            gauge(|s| s.quota_used),
        )?;
        family(
            &mut encoder,
            "fuse_quota_limit_bytes",
            "The volume's capacity, as its quota holds it",
            gauge(|s| s.quota_limit),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_counters_files_of_object_names_are_volumes() {
        for (name, want) in [
            ("pvc-1.counters", Some("pvc-1")),
            ("a.b-c.counters", Some("a.b-c")),
            ("pvc-1.json", None),
            ("pvc-1.capacity", None),
            ("pvc-1.counters.tmp", None),
            ("Upper.counters", None),
            (".counters", None),
            ("x y.counters", None),
        ] {
            assert_eq!(volume_of(Path::new(name)).as_deref(), want, "{name}");
        }
    }

    #[test]
    fn a_scrape_shows_each_mounts_counters_labelled_by_volume_and_node() {
        let dir = tempfile::tempdir().unwrap();
        let a = counters::CountersFile::open(&dir.path().join("vol-a.counters")).unwrap();
        a.table().op(Op::Write);
        a.table().op(Op::Write);
        a.table().took(Op::Write, 30_000);
        a.table().took(Op::Write, 2_000_000);
        a.table().error(libc::ENOSPC);
        a.table().bytes(counters::Slot::WrittenBytes, 8192);
        a.table().set_quota(8192, 1 << 20);
        let b = counters::CountersFile::open(&dir.path().join("vol-b.counters")).unwrap();
        b.table().op(Op::Lookup);
        b.table().took(Op::Lookup, 1_500);
        b.table().op(Op::Rename);
        b.table().took(Op::Rename, 250_000_000);
        // Not a volume's counters: ignored.
        std::fs::write(dir.path().join("vol-c.counters"), b"junk").unwrap();
        std::fs::write(dir.path().join("vol-a.json"), b"{}").unwrap();
        let mut registry = prometheus_client::registry::Registry::with_prefix("tessera");
        // vol-a belongs to a claim, vol-b to none.
        let claims = Claims::default();
        claims.write().unwrap().insert(
            "vol-a".into(),
            tessera_runtime::metrics::objects::Claim {
                pvc: "data".into(),
                pvc_namespace: "db".into(),
            },
        );
        registry.register_collector(Box::new(MountCounters::new(
            dir.path().to_owned(),
            "n1".into(),
            claims,
        )));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "tessera_fuse_operations_total{volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 2",
            "tessera_fuse_operations_total{volume=\"vol-b\",node=\"n1\",pvc=\"\",pvc_namespace=\"\",op=\"lookup\"} 1",
            "tessera_fuse_errors_total{volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",errno=\"ENOSPC\"} 1",
            "tessera_fuse_written_bytes_total{volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\"} 8192",
            "tessera_fuse_read_bytes_total{volume=\"vol-b\",node=\"n1\",pvc=\"\",pvc_namespace=\"\"} 0",
            "tessera_fuse_quota_used_bytes{volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\"} 8192",
            "tessera_fuse_quota_limit_bytes{volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\"} 1048576",
            // 30 µs and 2 ms.
            "tessera_fuse_operation_seconds_total{volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 0.00203",
            "tessera_fuse_operation_seconds_total{volume=\"vol-b\",node=\"n1\",pvc=\"\",pvc_namespace=\"\",op=\"rename\"} 0.25",
            "# TYPE tessera_fuse_operation_duration_seconds histogram",
            "tessera_fuse_operation_duration_seconds_sum{volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 0.00203",
            "tessera_fuse_operation_duration_seconds_count{volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 2",
            // Cumulative: 30 µs is above 25 µs, at most 50 µs; 2 ms at most 2.5 ms.
            "tessera_fuse_operation_duration_seconds_bucket{le=\"0.000025\",volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 0",
            "tessera_fuse_operation_duration_seconds_bucket{le=\"0.00005\",volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 1",
            "tessera_fuse_operation_duration_seconds_bucket{le=\"0.001\",volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 1",
            "tessera_fuse_operation_duration_seconds_bucket{le=\"0.0025\",volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 2",
            "tessera_fuse_operation_duration_seconds_bucket{le=\"+Inf\",volume=\"vol-a\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",op=\"write\"} 2",
            "tessera_fuse_operation_duration_seconds_bucket{le=\"0.000005\",volume=\"vol-b\",node=\"n1\",pvc=\"\",pvc_namespace=\"\",op=\"lookup\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("vol-c"), "{text}");
        assert!(
            !text.contains("op=\"read\""),
            "a kind never served is not shown: {text}"
        );
        assert!(
            !text.contains("tessera_fuse_operation_duration_seconds_count{volume=\"vol-b\",node=\"n1\",pvc=\"\",pvc_namespace=\"\",op=\"rename\"}"),
            "an untimed kind has a total, no histogram: {text}"
        );
    }

    /// A counters file of the previous layout (v1), as a daemon of the previous
    /// release writes it during an upgrade: "TSRFUSE1", 35 slots, one per 64 bytes.
    fn v1_file(values: &[(usize, u64)]) -> Vec<u8> {
        let mut bytes = vec![0u8; 4096];
        bytes[..8].copy_from_slice(b"TSRFUSE1");
        bytes[8..16].copy_from_slice(&35u64.to_ne_bytes());
        for (slot, v) in values {
            let off = 64 + 64 * slot;
            bytes[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        }
        bytes
    }

    #[test]
    fn an_old_daemons_counters_are_exported_without_durations() {
        let dir = tempfile::tempdir().unwrap();
        // 3 reads (kind 9), 1 EIO (class 6), 512 bytes read (slot 31).
        let old = v1_file(&[(9, 3), (22 + 6, 1), (31, 512)]);
        std::fs::write(dir.path().join("vol-old.counters"), old).unwrap();
        let new = counters::CountersFile::open(&dir.path().join("vol-new.counters")).unwrap();
        new.table().op(Op::Read);
        new.table().took(Op::Read, 40_000);
        let mut registry = prometheus_client::registry::Registry::with_prefix("tessera");
        registry.register_collector(Box::new(MountCounters::new(
            dir.path().to_owned(),
            "n1".into(),
            Claims::default(),
        )));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let old = "volume=\"vol-old\",node=\"n1\",pvc=\"\",pvc_namespace=\"\"";
        for line in [
            format!("tessera_fuse_operations_total{{{old},op=\"read\"}} 3"),
            format!("tessera_fuse_errors_total{{{old},errno=\"EIO\"}} 1"),
            format!("tessera_fuse_read_bytes_total{{{old}}} 512"),
            "tessera_fuse_operation_duration_seconds_count{volume=\"vol-new\",node=\"n1\",pvc=\"\",pvc_namespace=\"\",op=\"read\"} 1".to_string(),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
        let durations = text
            .lines()
            .filter(|l| l.starts_with("tessera_fuse_operation_"))
            .filter(|l| l.contains("vol-old"))
            .collect::<Vec<_>>();
        assert!(durations.is_empty(), "{durations:?}");
    }
}
