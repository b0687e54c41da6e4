//! `kubectl tessera`: status, doctor and tickets for Tessera volumes (kubectl finds
//! this binary as `kubectl-tessera` on PATH).
//!
//! This file is the command line and the output; `read` does the API reads and fills
//! the plain structures of `tessera_plugin`, whose pure functions render and judge.

mod pods;
mod preflight;
mod read;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};

use tessera_plugin::preflight::{Scope, parse_root};
use tessera_plugin::{doctor, mounts, status, tickets};

/// kubectl tessera: what a Tessera volume waits for, and whether the install is healthy.
#[derive(Parser, Debug)]
#[command(name = "kubectl tessera", version)]
struct Cli {
    /// Path of the kubeconfig (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace of a claim or Pod named by `status` (default: the kubeconfig context's,
    /// as kubectl; in a Pod, its own).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// `pods`: every namespace (the other commands name one object, or list what is
    /// cluster-wide: `mounts` lists every MountPod).
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// Namespace Tessera is installed in (its controller Lease and Pods).
    #[arg(
        long,
        global = true,
        env = "TESSERA_NAMESPACE",
        default_value = "tessera-system"
    )]
    tessera_namespace: String,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Cut lines to this many columns (default: $COLUMNS, else the terminal's width;
    /// 0: never cut).
    #[arg(long, global = true)]
    width: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// PVC → PV → VolumeAttachments → tickets → MountPods → agents → agent log.
    Status {
        /// `pvc/NAME`, `pod/NAME` (each Tessera volume of the Pod), `pv/NAME`,
        /// `volume/NAME` or a Volume's name.
        target: String,
        /// Lines of each agent's log to search for the volume.
        #[arg(long, default_value_t = 500)]
        log_lines: i64,
        /// Lines of log to show per node.
        #[arg(long, default_value_t = 10)]
        show_lines: usize,
    },
    /// Check the install; exits 1 when a problem is found.
    Doctor {
        /// A ticket waiting longer than this is a problem (`90s`, `5m`, `1h`).
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        waiting_threshold: i64,
        /// An object deleted longer ago and still held by finalizers is stuck.
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        stuck_threshold: i64,
        /// Name of the controller's leader-election Lease.
        #[arg(long, default_value = "tessera-controller")]
        lease: String,
        /// Only look at Tessera objects (Volumes, VolumeAttachments, MountPods) with
        /// these labels (`k=v,…`).
        #[arg(short = 'l', long)]
        selector: Option<String>,
        /// Only check the Nodes with these labels for an agent (where the DaemonSet runs).
        #[arg(long)]
        node_selector: Option<String>,
    },
    /// Check each node before install (or after): /dev/fuse, the kernel, the hostPaths
    /// the node DaemonSet needs, each backend root, and whether each root is shared
    /// between the nodes. Runs one short Pod per node and round in the Tessera
    /// namespace (which must allow hostPath Pods); exits 1 when a problem is found.
    Preflight {
        /// Image of the preflight Pods (default: the node DaemonSet's, else
        /// tessera:<this plugin's version>).
        #[arg(long)]
        image: Option<String>,
        /// A backend root to check: PATH, PATH=shared or PATH=node-local (what it must
        /// be); repeated. Default: the tessera-backend-roots ConfigMap's roots, else
        /// those config/ ships.
        #[arg(long = "root", value_parser = parse_root)]
        roots: Vec<(String, Scope)>,
        /// The kubelet's root directory on the nodes.
        #[arg(long, default_value = "/var/lib/kubelet")]
        kubelet_dir: String,
        /// Only the Nodes with these labels (`k=v,…`).
        #[arg(long)]
        node_selector: Option<String>,
        /// How long each round of Pods may take.
        #[arg(long, default_value = "2m", value_parser = parse_duration)]
        timeout: i64,
    },
    /// Every MountPod, a line each, by node: volume, claim, phase, references,
    /// restarts, OOM kills, age and what is wrong.
    Mounts {
        /// Only the MountPods of this node.
        #[arg(long)]
        node: Option<String>,
    },
    /// The Pods with Tessera volumes in the namespace (-A: in every namespace), a line
    /// per volume: its claim and Volume, the MountPod serving it on the Pod's node,
    /// whether it is bound into the Pod, and what is wrong.
    Pods {
        /// Only the Pods on this node.
        #[arg(long)]
        node: Option<String>,
    },
    /// The tickets of a volume: owner (field manager) and how long each waits.
    Tickets {
        /// The Volume (`volume/NAME` or NAME).
        volume: String,
    },
}

/// A duration argument in whole seconds, in the grammar of every Tessera duration
/// ([`tessera_text::duration`]: `90`, `90s`, `5m`, `1h30m`, `2d`).
fn parse_duration(s: &str) -> Result<i64, String> {
    let d = tessera_text::duration::parse(s).map_err(|e| e.to_string())?;
    i64::try_from(d.as_secs()).map_err(|_| format!("{s:?} is too long"))
}

/// Where kubectl would send us, and the namespace it would use when not told.
async fn client(cli: &Cli) -> Result<(kube::Client, String), read::Error> {
    let config = if cli.kubeconfig.is_none() && cli.context.is_none() {
        kube::Config::infer()
            .await
            .map_err(|e| read::Error::Config(e.to_string()))?
    } else {
        let kc = match &cli.kubeconfig {
            Some(p) => Kubeconfig::read_from(p),
            None => Kubeconfig::read(),
        }
        .map_err(|e| read::Error::Config(e.to_string()))?;
        let opts = KubeConfigOptions {
            context: cli.context.clone(),
            ..Default::default()
        };
        kube::Config::from_custom_kubeconfig(kc, &opts)
            .await
            .map_err(|e| read::Error::Config(e.to_string()))?
    };
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).map_err(|e| read::Error::Config(e.to_string()))?;
    Ok((client, namespace))
}

/// The width to cut lines to: the flag, `$COLUMNS`, or the terminal's; none when
/// stdout is not a terminal (a pipe gets whole lines).
fn width(flag: Option<usize>) -> Option<usize> {
    if let Some(w) = flag {
        return (w > 0).then_some(w);
    }
    if let Some(w) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<usize>().ok())
    {
        return (w > 0).then_some(w);
    }
    terminal_width()
}

fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    terminal_size::terminal_size_of(std::io::stdout())
        .map(|(terminal_size::Width(w), _)| usize::from(w))
        .filter(|w| *w > 0)
}

/// 1 when a finding is a problem (doctor, preflight), else 0.
fn exit_code(findings: &[doctor::Finding]) -> ExitCode {
    if findings
        .iter()
        .any(|f| f.severity == doctor::Severity::Problem)
    {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `status pod/NAME` as text: each Tessera volume's report under a line naming it,
/// first what serves it on the Pod's node (the Pod's `uid`).
fn pod_text(
    namespace: &str,
    name: &str,
    uid: &str,
    found: &[pods::PodVolumeReport],
    now: jiff::Timestamp,
    width: Option<usize>,
) -> String {
    if found.is_empty() {
        return format!(
            "Pod {namespace}/{name} has no claim and no inline csi.tessera.io volume\n"
        );
    }
    let mut out = String::new();
    for (i, v) in found.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("── Pod {namespace}/{name}, volume {}\n", v.volume));
        match &v.report {
            Some(r) => {
                for l in tessera_plugin::pods::serving(r, &v.node, uid) {
                    out.push_str(&l);
                    out.push('\n');
                }
                out.push_str(&status::render(r, now, width));
            }
            None => out.push_str("   not a Tessera volume (its PV is another driver's)\n"),
        }
    }
    out
}

fn json<T: serde::Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("plain data serializes");
    s.push('\n');
    s
}

async fn run(cli: Cli) -> Result<ExitCode, read::Error> {
    if cli.all_namespaces && !matches!(cli.command, Command::Pods { .. } | Command::Mounts { .. }) {
        return Err(read::Error::Usage(
            "-A/--all-namespaces lists Pods (`pods -A`); this command names one object".into(),
        ));
    }
    let (client, context_namespace) = client(&cli).await?;
    let namespace = cli.namespace.clone().unwrap_or(context_namespace);
    let now = jiff::Timestamp::now();
    let width = width(cli.width);
    match &cli.command {
        Command::Status {
            target,
            log_lines,
            show_lines,
        } => {
            let limits = read::LogLimits {
                search: *log_lines,
                show: *show_lines,
            };
            let target = read::Target::parse(target, &namespace)?;
            if let read::Target::Pod { namespace, name } = &target {
                let (found, uid) =
                    pods::pod_status(&client, namespace, name, &cli.tessera_namespace, &limits)
                        .await?;
                match cli.output {
                    Output::Json => print!("{}", json(&found)),
                    Output::Text => {
                        print!("{}", pod_text(namespace, name, &uid, &found, now, width))
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
            let report = read::status(&client, &target, &cli.tessera_namespace, &limits).await?;
            match cli.output {
                Output::Json => print!("{}", json(&report)),
                Output::Text => print!("{}", status::render(&report, now, width)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Pods { node } => {
            let ns = (!cli.all_namespaces).then_some(namespace.as_str());
            let rows = pods::pod_rows(&client, ns, node.as_deref()).await?;
            match cli.output {
                Output::Json => print!("{}", json(&rows)),
                Output::Text => print!(
                    "{}",
                    tessera_plugin::pods::render(&rows, cli.all_namespaces, width)
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Mounts { node } => {
            let all = read::mountpods(&client).await?;
            let rows = mounts::rows(&all, node.as_deref());
            match cli.output {
                Output::Json => print!("{}", json(&rows)),
                Output::Text => print!("{}", mounts::render(&rows, now, width)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Preflight {
            image,
            roots,
            kubelet_dir,
            node_selector,
            timeout,
        } => {
            let opts = preflight::Options {
                namespace: cli.tessera_namespace.clone(),
                image: image.clone(),
                roots: roots.clone(),
                kubelet_dir: kubelet_dir.clone(),
                node_selector: node_selector.clone(),
                timeout: std::time::Duration::from_secs(u64::try_from(*timeout).unwrap_or(0)),
            };
            let g = preflight::gather(&client, &opts).await?;
            let mut findings = g.failures;
            findings.extend(tessera_plugin::preflight::diagnose(
                &g.facts,
                &g.sightings,
                &g.roots,
            ));
            match cli.output {
                Output::Json => print!(
                    "{}",
                    json(
                        &serde_json::json!({"nodes": g.facts, "sightings": g.sightings, "findings": findings})
                    )
                ),
                Output::Text => print!("{}", doctor::render(&findings, width)),
            }
            Ok(exit_code(&findings))
        }
        Command::Tickets { volume } => {
            let name = volume.strip_prefix("volume/").unwrap_or(volume);
            let rows = read::ticket_rows(&client, name).await?;
            match cli.output {
                Output::Json => print!("{}", json(&rows)),
                Output::Text => print!("{}", tickets::render(&rows, now, width)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor {
            waiting_threshold,
            stuck_threshold,
            lease,
            selector,
            node_selector,
        } => {
            let selectors = read::Selectors {
                objects: selector.as_deref(),
                nodes: node_selector.as_deref(),
            };
            let inv = read::inventory(&client, &cli.tessera_namespace, lease, selectors).await?;
            let th = doctor::Thresholds {
                waiting_secs: *waiting_threshold,
                stuck_secs: *stuck_threshold,
            };
            let findings = doctor::diagnose(&inv, now, th);
            match cli.output {
                Output::Json => print!(
                    "{}",
                    json(&serde_json::json!({"inventory": inv, "findings": findings}))
                ),
                Output::Text => print!("{}", doctor::render(&findings, width)),
            }
            Ok(exit_code(&findings))
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kubectl tessera: {}", tessera_runtime::error_chain(&e));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        for (s, want) in [
            ("90", Ok(90)),
            ("90s", Ok(90)),
            ("5m", Ok(300)),
            ("1h", Ok(3600)),
            ("2d", Ok(172_800)),
            ("1h30m", Ok(5400)),
            ("1.5h", Ok(5400)),
        ] {
            assert_eq!(parse_duration(s), want, "{s}");
        }
        for bad in ["", "m", "5x", "-3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_command_line_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "kubectl-tessera",
            "status",
            "pvc/data",
            "-n",
            "apps",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.output, Output::Json);
        assert!(matches!(cli.command, Command::Status { ref target, .. } if target == "pvc/data"));
        assert_eq!(cli.namespace.as_deref(), Some("apps"));
        // Without -n: the context's namespace, decided once the kubeconfig is read.
        let cli = Cli::try_parse_from(["kubectl-tessera", "status", "pod/web"]).unwrap();
        assert_eq!(cli.namespace, None);
        // -n before the command, as kubectl takes it too.
        let cli = Cli::try_parse_from(["kubectl-tessera", "-n", "shop", "mounts", "--node", "a"])
            .unwrap();
        assert_eq!(cli.namespace.as_deref(), Some("shop"));
        assert!(matches!(cli.command, Command::Mounts { node: Some(ref n) } if n == "a"));
        let cli = Cli::try_parse_from(["kubectl-tessera", "pods", "-A"]).unwrap();
        assert!(cli.all_namespaces);
        assert!(matches!(cli.command, Command::Pods { node: None }));
        let cli = Cli::try_parse_from(["kubectl-tessera", "pods"]).unwrap();
        assert!(!cli.all_namespaces);
    }
}
