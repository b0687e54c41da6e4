//! The standard process metrics (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`), under the
//! names every Prometheus client library uses, so stock dashboards read them: read
//! from `/proc/self` on each scrape and parsed by pure functions.
//!
//! ```text
//!  GET /metrics ─▶ ProcessCollector::encode ─▶ /proc/self/stat, /proc/stat (btime),
//!                  /proc/self/fd, getrlimit ─▶ parse_stat (pure) ─▶ process_* families
//! ```

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What `/proc/self/stat` says of the process, in units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    /// User and system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Seconds after boot the process started.
    pub start_after_boot: f64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: u64,
    /// Resident set size, bytes.
    pub resident_bytes: u64,
}

/// Parse `/proc/self/stat` (`ticks` clock ticks a second, pages of `page` bytes).
/// The command name (field 2) may hold spaces and parentheses: fields are counted
/// from the last `)`.
pub fn parse_stat(text: &str, ticks: u64, page: u64) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // Fields 3.. of proc(5): rest[0] is field 3 (state).
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    let ticks = ticks.max(1) as f64;
    Some(Stat {
        cpu_seconds: (num(14)? + num(15)?) as f64 / ticks,
        start_after_boot: num(22)? as f64 / ticks,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)?.saturating_mul(page),
    })
}

/// The boot time (`btime`, seconds since the epoch) in `/proc/stat`.
pub fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// The collector registered in every role's registry (without the `tessera_` prefix).
#[derive(Debug, Default)]
pub struct ProcessCollector;

fn sysconf(name: libc::c_int) -> u64 {
    // SAFETY: sysconf reads a configuration value; no memory is passed.
    u64::try_from(unsafe { libc::sysconf(name) }).unwrap_or(0)
}

fn max_fds() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim.rlim_cur)
}

fn one<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    metric: M,
) -> Result<(), std::fmt::Error> {
    metric.encode(encoder.encode_descriptor(name, help, None, kind)?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|t| parse_stat(&t, sysconf(libc::_SC_CLK_TCK), sysconf(libc::_SC_PAGESIZE)));
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| parse_btime(&t));
        if let Some(s) = stat {
            one(
                &mut encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                MetricType::Counter,
                ConstCounter::new(s.cpu_seconds),
            )?;
            one(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                MetricType::Gauge,
                ConstGauge::new(i64::try_from(s.resident_bytes).unwrap_or(i64::MAX)),
            )?;
            one(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                MetricType::Gauge,
                ConstGauge::new(i64::try_from(s.virtual_bytes).unwrap_or(i64::MAX)),
            )?;
            if let Some(b) = btime {
                one(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds",
                    MetricType::Gauge,
                    ConstGauge::new(b as f64 + s.start_after_boot),
                )?;
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory's own descriptor is counted too, as client_golang does.
            let n = dir.count();
            one(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                MetricType::Gauge,
                ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)),
            )?;
        }
        if let Some(n) = max_fds() {
            one(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                MetricType::Gauge,
                ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis, as a process may name itself.
        let line = "4242 (tes) sera) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 9 0 \
                    12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(line, 100, 4096).unwrap();
        assert_eq!(s.cpu_seconds, 3.0, "(250 + 50) ticks at 100 a second");
        assert_eq!(s.start_after_boot, 123.45);
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.resident_bytes, 2560 * 4096);
        assert_eq!(parse_stat("4242 (x) S 1 2", 100, 4096), None, "cut short");
        assert_eq!(parse_stat("no parenthesis", 100, 4096), None);
    }

    #[test]
    fn boot_time_from_proc_stat() {
        let text = "cpu  1 2 3\nintr 5\nctxt 9\nbtime 1764790000\nprocesses 7\n";
        assert_eq!(parse_btime(text), Some(1_764_790_000));
        assert_eq!(parse_btime("cpu 1\n"), None);
    }

    #[test]
    fn this_process_is_exported() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(name), "{name} in {text}");
        }
    }
}
