//! The node-side logic against an in-memory kernel: a mount table and daemons that
//! "mount" when started and leave a dead (ENOTCONN) mount behind when killed.

use std::collections::HashMap;
use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::signal::Signal;

use tessera_api::{MountPodSpec, MountReference, MountTask};
use tessera_host::mounts::MountInfo;

use super::*;

#[derive(Default)]
struct World {
    table: Vec<MountInfo>,
    next: u32,
    dead_devs: Vec<String>,
    hang: bool,
    fail_start: bool,
    procs: HashMap<i32, (bool, String)>,
    started: Vec<DaemonSpec>,
    signals: Vec<(i32, Signal)>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<World>>);

impl Fake {
    fn w(&self) -> std::sync::MutexGuard<'_, World> {
        self.0.lock().unwrap()
    }

    /// kill -9 of a daemon: its mount stays, broken.
    fn crash(&self, pid: i32) {
        let mut w = self.w();
        w.procs
            .insert(pid, (false, "fuse daemon exited: signal 9".into()));
        let dev = format!("0:{pid}");
        w.dead_devs.push(dev);
    }

    fn top(&self, path: &Path) -> Option<MountInfo> {
        self.w()
            .table
            .iter()
            .rev()
            .find(|m| m.mount_point == path)
            .cloned()
    }
}

impl Mounts for Fake {
    fn table(&self) -> Result<Vec<MountInfo>, mounts::Error> {
        Ok(self.w().table.clone())
    }

    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), mounts::Error> {
        let Some(src) = self.top(source) else {
            return Err(mounts::Error::Bind {
                from: source.into(),
                target: target.into(),
                errno: Errno::EINVAL,
            });
        };
        let mut w = self.w();
        w.next += 1;
        let id = 1000 + u64::from(w.next);
        w.table.push(MountInfo {
            mount_id: id,
            mount_point: target.into(),
            options: if read_only { "ro".into() } else { "rw".into() },
            ..src
        });
        Ok(())
    }

    fn unmount_lazy(&self, target: &Path) -> Result<bool, mounts::Error> {
        let mut w = self.w();
        match w.table.iter().rposition(|m| m.mount_point == target) {
            Some(i) => {
                w.table.remove(i);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn probe(&self, path: &Path, _timeout: Duration) -> Probe {
        let top = self.top(path);
        let w = self.w();
        match top {
            None if path.exists() => Probe::NotMounted,
            None => Probe::Missing,
            Some(m) if w.dead_devs.contains(&m.dev) => Probe::Broken(Errno::ENOTCONN),
            Some(_) if w.hang => Probe::TimedOut,
            Some(m) => Probe::Answers {
                dev: m.mount_id,
                ino: 1,
            },
        }
    }
}

impl Daemons for Fake {
    fn start(&self, spec: &DaemonSpec, _log: &Path) -> Result<Daemon, supervisor::Error> {
        let mut guard = self.w();
        let w = &mut *guard;
        w.next += 1;
        let pid = 100 + w.next as i32;
        w.started.push(spec.clone());
        if w.fail_start {
            w.procs
                .insert(pid, (false, "fuse daemon exited: status 1".into()));
        } else {
            w.procs.insert(pid, (true, String::new()));
            w.table.push(MountInfo {
                mount_id: u64::from(w.next),
                parent_id: 1,
                dev: format!("0:{pid}"),
                root: "/".into(),
                mount_point: spec.mountpoint.clone(),
                options: "rw".into(),
                fs_type: "fuse.tessera".into(),
                source: "tessera".into(),
            });
        }
        Ok(Daemon {
            pid,
            start_ticks: 1,
        })
    }

    fn liveness(&self, daemon: Daemon, _mountpoint: &Path) -> Liveness {
        match self.w().procs.get(&daemon.pid) {
            Some((true, _)) => Liveness::Running,
            Some((false, why)) => Liveness::Exited(why.clone()),
            None => Liveness::Exited("fuse daemon exited".into()),
        }
    }

    fn signal(
        &self,
        daemon: Daemon,
        mountpoint: &Path,
        signal: Signal,
    ) -> Result<(), supervisor::Error> {
        if self.liveness(daemon, mountpoint) != Liveness::Running {
            return Ok(());
        }
        self.w().signals.push((daemon.pid, signal));
        match signal {
            Signal::SIGTERM => {
                // A clean exit unmounts.
                self.w()
                    .procs
                    .insert(daemon.pid, (false, "fuse daemon exited: status 0".into()));
                self.unmount_lazy(mountpoint).unwrap();
            }
            Signal::SIGKILL => self.crash(daemon.pid),
            _ => {}
        }
        Ok(())
    }

    fn reap(&self) {}
}

struct Setup {
    dir: tempfile::TempDir,
    fake: Fake,
    host: MountService,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    for d in [
        "backend",
        "mounts",
        "kubelet/pods/p1/vol",
        "kubelet/pods/p2/vol",
        "state",
    ] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    let fake = Fake::default();
    let host = MountService {
        config: Config {
            mount_root: dir.path().join("mounts"),
            kubelet_dir: dir.path().join("kubelet"),
            allowed_roots: tessera_host::roots::AllowedRoots::new([dir
                .path()
                .join("backend")
                .display()
                .to_string()])
            .unwrap(),
            probe_timeout: Duration::from_millis(100),
            start_timeout: Duration::from_secs(1),
            stop_grace: Duration::from_millis(100),
            fencing: true,
            agent_mounts: false,
        },
        mounts: Arc::new(fake.clone()),
        daemons: Arc::new(fake.clone()),
        state: StateDir::open(&dir.path().join("state")).unwrap(),
        holder: None,
        shared: Default::default(),
        hung: Default::default(),
    };
    Setup { dir, fake, host }
}

impl Setup {
    fn spec(&self, refs: &[(&str, bool)]) -> MountPodSpec {
        MountPodSpec {
            populate_from: None,
            volume: "vol1".into(),
            node_name: "n1".into(),
            source: self.dir.path().join("backend/vol1").display().to_string(),
            task: MountTask::Serve,
            capacity_bytes: 1000,
            read_only: false,
            shared_backend: false,
            shared_root_anchor: None,
            mount_options: vec![],
            references: refs
                .iter()
                .map(|(t, ro)| MountReference {
                    target_path: self.dir.path().join(t).display().to_string(),
                    owner: "pod/x".into(),
                    read_only: *ro,
                    pod: None,
                })
                .collect(),
            retain_seconds: None,
            resources: None,
            attr_cache_seconds: None,
            self_fence: false,
        }
    }

    fn want(&self, spec: &MountPodSpec) -> Want {
        let (want, refused) = want("vol1-abc", spec, &self.host.config).unwrap();
        assert!(refused.is_empty(), "{refused:?}");
        want
    }

    fn serve(&self, want: &Want) -> Served {
        self.host.serve(want, &|_| {}).unwrap()
    }

    fn mountpoint(&self) -> PathBuf {
        self.dir.path().join("mounts/vol1")
    }
}

#[test]
fn starts_a_daemon_then_adopts_it() {
    let s = setup();
    let want = s.want(&s.spec(&[]));
    let progress = Mutex::new(Vec::new());
    let served = s
        .host
        .serve(&want, &|p| progress.lock().unwrap().push(p))
        .unwrap();
    assert!(served.answers);
    assert_eq!(served.repaired, None);
    assert_eq!(
        progress.into_inner().unwrap(),
        vec![Progress::Starting { cause: None }]
    );
    assert!(s.dir.path().join("backend/vol1").is_dir(), "source created");
    assert!(s.mountpoint().is_dir());
    let rec = s.host.state.load("vol1").unwrap().unwrap();
    assert_eq!(Some(rec.daemon), served.daemon);
    assert_eq!(rec.mountpod, "vol1-abc");
    assert_eq!(
        std::fs::read_to_string(s.host.state.capacity_file("vol1")).unwrap(),
        "1000\n"
    );

    // A second pass (or a restarted agent: the record is all it needs) adopts it.
    let again = s.serve(&want);
    assert!(again.answers);
    assert_eq!(again.daemon, served.daemon);
    assert_eq!(s.fake.w().started.len(), 1, "no second daemon");
}

#[test]
fn a_shared_root_is_served_only_where_the_anchors_marker_is_seen() {
    let s = setup();
    let backend = s.dir.path().join("backend");
    std::fs::create_dir_all(&backend).unwrap();
    // Another node is the anchor and left no marker this node can see: refused before
    // anything is created, no daemon started.
    let mut spec = s.spec(&[]);
    spec.shared_root_anchor = Some("n0".into());
    let err = s.host.serve(&s.want(&spec), &|_| {}).unwrap_err();
    assert!(matches!(err, Error::NotShared(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("node n1") && msg.contains("node n0"), "{msg}");
    assert!(!backend.join("vol1").exists(), "data directory created");
    assert!(s.fake.w().started.is_empty(), "a daemon started");
    assert!(
        s.host
            .check_shared(&spec.source, "vol1", "n1", Some("n0"))
            .is_err()
    );
    // This node is the anchor: it leaves the marker and serves.
    spec.shared_root_anchor = Some("n1".into());
    assert!(s.serve(&s.want(&spec)).answers);
    assert!(backend.join(".tessera-shared-n1").is_file());
    assert!(backend.join("vol1").is_dir());
    // No anchor (a NodeLocal volume): nothing to check.
    assert!(
        s.host
            .check_shared(&spec.source, "vol1", "n1", None)
            .is_ok()
    );
}

#[test]
fn repairs_a_killed_daemon_and_rebinds_every_reference() {
    let s = setup();
    let want = s.want(&s.spec(&[
        ("kubelet/pods/p1/vol", false),
        ("kubelet/pods/p2/vol", true),
    ]));
    let first = s.serve(&want);
    assert_eq!(first.rebound, 2, "references bound on a new mount");
    let pid = first.daemon.unwrap().pid;
    s.fake.crash(pid);
    let rec = s.host.state.load("vol1").unwrap().unwrap();
    assert_eq!(
        s.host.health(&rec),
        Health::Broken("fuse daemon exited: signal 9".into())
    );

    let progress = Mutex::new(Vec::new());
    let served = s
        .host
        .serve(&want, &|p| progress.lock().unwrap().push(p))
        .unwrap();
    assert!(served.answers);
    assert_eq!(
        served.repaired.as_deref(),
        Some("fuse daemon exited: signal 9")
    );
    assert!(served.repair_time.is_some());
    assert_eq!(
        progress.into_inner().unwrap(),
        vec![Progress::Starting {
            cause: Some("fuse daemon exited: signal 9".into())
        }]
    );
    assert_eq!(served.rebound, 2);
    assert!(
        served.rebind_errors.is_empty(),
        "{:?}",
        served.rebind_errors
    );
    let new_pid = served.daemon.unwrap().pid;
    assert_ne!(new_pid, pid);
    // Only live mounts remain: the new mount and one bind on each target.
    let table = s.fake.w().table.clone();
    assert_eq!(table.len(), 3, "{table:#?}");
    assert!(table.iter().all(|m| m.dev == format!("0:{new_pid}")));
    let p2 = s
        .fake
        .top(&s.dir.path().join("kubelet/pods/p2/vol"))
        .unwrap();
    assert!(p2.read_only(), "read-only reference re-bound read-only");
    let p1 = s
        .fake
        .top(&s.dir.path().join("kubelet/pods/p1/vol"))
        .unwrap();
    assert!(!p1.read_only());
}

#[test]
fn rebinds_references_left_on_an_earlier_instance() {
    let s = setup();
    let want = s.want(&s.spec(&[("kubelet/pods/p1/vol", false)]));
    let first = s.serve(&want);
    // An agent died after restarting the daemon but before re-binding: the record
    // points to a healthy daemon, the target still holds the old, dead bind.
    s.fake.crash(first.daemon.unwrap().pid);
    s.host.mounts.unmount_lazy(&s.mountpoint()).unwrap();
    let spec = DaemonSpec {
        volume: "vol1".into(),
        mountpod: "vol1-abc".into(),
        mountpod_uid: String::new(),
        source: want.source.clone(),
        mountpoint: want.mountpoint.clone(),
        capacity_bytes: 1000,
        capacity_file: s.host.state.capacity_file("vol1"),
        counters_file: s.host.state.counters_file("vol1"),
        read_only: false,
        shared_backend: false,
        options: vec![],
        resources: None,
        settings_file: None,
        fence_file: None,
        handoff: None,
        mounted: false,
    };
    let daemon = s.fake.start(&spec, Path::new("/dev/null")).unwrap();
    let mut rec = s.host.state.load("vol1").unwrap().unwrap();
    rec.daemon = daemon;
    s.host.state.save(&rec).unwrap();

    let served = s.serve(&want);
    assert_eq!(served.repaired, None);
    assert_eq!(served.rebound, 1);
    let target = s
        .fake
        .top(&s.dir.path().join("kubelet/pods/p1/vol"))
        .unwrap();
    assert_eq!(target.dev, format!("0:{}", daemon.pid));
}

#[test]
fn capacity_grows_online() {
    let s = setup();
    let mut spec = s.spec(&[]);
    let first = s.serve(&s.want(&spec));
    spec.capacity_bytes = 5000;
    let served = s.serve(&s.want(&spec));
    assert_eq!(served.daemon, first.daemon, "no remount");
    assert_eq!(
        std::fs::read_to_string(s.host.state.capacity_file("vol1")).unwrap(),
        "5000\n"
    );
    assert_eq!(
        s.fake.w().signals,
        vec![(first.daemon.unwrap().pid, Signal::SIGHUP)]
    );
    assert_eq!(
        s.host.state.load("vol1").unwrap().unwrap().capacity_bytes,
        5000
    );
    // Applied once.
    s.serve(&s.want(&spec));
    assert_eq!(s.fake.w().signals.len(), 1);
}

#[test]
fn the_attribute_cache_lifetime_changes_online() {
    let s = setup();
    let mut spec = s.spec(&[("kubelet/pods/p1/vol", false)]);
    let first = s.serve(&s.want(&spec));
    let settings = s.host.state.settings_file("vol1");
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), "{}\n");
    spec.attr_cache_seconds = Some(60);
    let served = s.serve(&s.want(&spec));
    assert_eq!(
        served.daemon, first.daemon,
        "no remount, with a reference bound"
    );
    assert_eq!(
        std::fs::read_to_string(&settings).unwrap(),
        "{\"attrCacheSeconds\":60}\n"
    );
    assert_eq!(
        s.fake.w().signals,
        vec![(first.daemon.unwrap().pid, Signal::SIGHUP)]
    );
    let rec = s.host.state.load("vol1").unwrap().unwrap();
    assert_eq!(rec.attr_cache_seconds, Some(60));
    // Applied once; back to the default is a change too.
    s.serve(&s.want(&spec));
    assert_eq!(s.fake.w().signals.len(), 1);
    spec.attr_cache_seconds = None;
    s.serve(&s.want(&spec));
    assert_eq!(s.fake.w().signals.len(), 2);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), "{}\n");
}

#[test]
fn settings_change_remounts_only_without_references() {
    let s = setup();
    let mut spec = s.spec(&[("kubelet/pods/p1/vol", false)]);
    let first = s.serve(&s.want(&spec));
    spec.read_only = true;
    let blocked = s.serve(&s.want(&spec));
    assert!(blocked.remount_blocked);
    assert!(blocked.answers);
    assert_eq!(blocked.daemon, first.daemon);

    spec.references.clear();
    let served = s.serve(&s.want(&spec));
    assert!(!served.remount_blocked);
    assert_ne!(served.daemon, first.daemon, "remounted");
    assert_eq!(served.repaired, None, "a remount is no repair");
    let w = s.fake.w();
    assert_eq!(
        w.signals,
        vec![(first.daemon.unwrap().pid, Signal::SIGTERM)]
    );
    assert!(w.started[1].read_only);
}

#[test]
fn shared_backend_is_given_at_start_and_never_restarts_a_daemon() {
    let s = setup();
    // The test's backend is a node-local filesystem: without the flag the agent
    // claims nothing about locks, with it the backend is probed as the daemon does.
    let plain = s.serve(&s.want(&s.spec(&[])));
    assert_eq!(plain.locks, None);
    s.host.teardown("vol1", &s.mountpoint()).unwrap();

    let mut spec = s.spec(&[]);
    spec.shared_backend = true;
    let want = s.want(&spec);
    let first = s.serve(&want);
    assert!(first.shared_backend);
    assert_eq!(first.locks, Some(Ok(())));
    assert!(s.fake.w().started[1].shared_backend);
    assert!(s.host.state.load("vol1").unwrap().unwrap().shared_backend);

    // A daemon started before the field existed (its record lacks it) is adopted as
    // it is: no restart, and no claim that its locks cross nodes.
    let mut rec = s.host.state.load("vol1").unwrap().unwrap();
    rec.shared_backend = false;
    s.host.state.save(&rec).unwrap();
    let adopted = s.serve(&want);
    assert_eq!(adopted.daemon, first.daemon);
    assert!(!adopted.shared_backend);
    assert_eq!(adopted.locks, None);
    assert_eq!(s.fake.w().started.len(), 2, "no restart");

    // Its next start (here a repair) takes the flag.
    s.fake.crash(first.daemon.unwrap().pid);
    let repaired = s.serve(&want);
    assert!(repaired.repaired.is_some());
    assert!(repaired.shared_backend);
    assert!(s.fake.w().started[2].shared_backend);
}

#[test]
fn a_daemon_that_exits_while_starting_is_a_failure() {
    let s = setup();
    s.fake.w().fail_start = true;
    std::fs::write(
        s.host.state.log_file("vol1"),
        "error: cannot open /dev/fuse\n",
    )
    .unwrap();
    let served = s.serve(&s.want(&s.spec(&[])));
    assert!(!served.answers);
    assert_eq!(served.daemon, None);
    assert_eq!(
        served.failure.as_deref(),
        Some("fuse daemon exited: status 1; log: error: cannot open /dev/fuse")
    );
    // The next pass restarts it, as a repair.
    s.fake.w().fail_start = false;
    let served = s.serve(&s.want(&s.spec(&[])));
    assert!(served.answers);
    assert_eq!(
        served.repaired.as_deref(),
        Some("fuse daemon exited: status 1")
    );
}

#[test]
fn a_hung_mount_is_starting_while_young_then_broken_unless_it_answered_before() {
    let s = setup();
    let want = s.want(&s.spec(&[]));
    s.serve(&want);
    s.fake.w().hang = true;
    let mut rec = s.host.state.load("vol1").unwrap().unwrap();
    assert_eq!(s.host.health(&rec), Health::Starting);
    rec.started_at = (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60)).to_string();
    // Never answered: a start that failed.
    rec.answered = false;
    match s.host.health(&rec) {
        Health::Broken(why) => assert!(why.contains("did not answer"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Answered before: slow, for the hang grace (the next test).
    rec.answered = true;
    assert!(matches!(s.host.health(&rec), Health::Slow(_)));
}

#[test]
fn a_mount_that_answered_and_stops_answering_is_slow_and_kept_until_the_hang_grace() {
    // A loaded node (the power-off test's write storm: load 35 on two cores) or a
    // slow backend: a probe of a mount that served Pods times out. Repairing it then
    // unmounts the connection the Pods' containers hold: they see ENOTCONN until
    // they restart. Within the grace the mount is Slow and left alone.
    let s = setup();
    let want = s.want(&s.spec(&[("kubelet/pods/p1/vol", false)]));
    assert!(s.serve(&want).answers);
    let mut rec = s.host.state.load("vol1").unwrap().unwrap();
    rec.started_at = (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60)).to_string();
    s.host.state.save(&rec).unwrap();
    s.fake.w().hang = true;
    match s.host.health(&rec) {
        Health::Slow(why) => assert!(why.contains("did not answer"), "{why}"),
        other => panic!("{other:?}"),
    }
    let served = s.serve(&want);
    assert_eq!(served.repaired, None);
    assert_eq!(served.daemon, Some(rec.daemon), "the same daemon serves");
    assert_eq!(s.fake.w().started.len(), 1, "no second daemon");
    assert!(s.fake.w().signals.is_empty(), "the daemon was not stopped");
    assert!(s.fake.top(&s.mountpoint()).is_some(), "still mounted");

    // Answering again ends it; a new hang counts from its own start.
    s.fake.w().hang = false;
    assert_eq!(s.host.health(&rec), Health::Healthy);
    s.fake.w().hang = true;
    assert!(matches!(s.host.health(&rec), Health::Slow(_)));
    // Past the grace (two start timeouts) it is hung: repaired, as before.
    s.host.hung.backdate(
        &rec,
        hang_grace(s.host.config.start_timeout) + Duration::from_secs(1),
    );
    match s.host.health(&rec) {
        Health::Broken(why) => assert!(why.contains("did not answer"), "{why}"),
        other => panic!("{other:?}"),
    }
    let served = s.serve(&want);
    assert!(served.repaired.is_some());
}

#[test]
fn a_missing_backend_root_is_an_error() {
    let s = setup();
    let mut spec = s.spec(&[]);
    // A missing directory beneath the allowed root (the root of a Volume under it).
    spec.source = s.dir.path().join("backend/nope/vol1").display().to_string();
    let err = s.host.serve(&s.want(&spec), &|_| {}).unwrap_err();
    assert!(matches!(err, Error::NoBackendRoot(_)), "{err}");
    assert!(
        !s.dir.path().join("backend/nope").exists(),
        "nothing created outside"
    );
}

#[test]
fn paths_from_the_custom_resource_are_validated() {
    let s = setup();
    let mut spec = s.spec(&[("kubelet/pods/p1/vol", false)]);
    spec.references.push(MountReference {
        target_path: "/etc".into(),
        owner: "pod/evil".into(),
        read_only: false,
        pod: None,
    });
    spec.references.push(MountReference {
        target_path: format!("{}/../../etc", s.dir.path().join("kubelet").display()),
        owner: "pod/evil".into(),
        read_only: false,
        pod: None,
    });
    let (want, refused) = want("m", &spec, &s.host.config).unwrap();
    assert_eq!(want.references.len(), 1);
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused[0].contains("\"/etc\" is not under"), "{refused:?}");

    for (field, bad) in [
        ("source", "relative/dir"),
        ("source", "/"),
        ("source", "/a/../b"),
        ("volume", "../x"),
    ] {
        let mut spec = s.spec(&[]);
        match field {
            "source" => spec.source = bad.into(),
            _ => spec.volume = bad.into(),
        }
        assert!(
            super::want("m", &spec, &s.host.config).is_err(),
            "{field}={bad}"
        );
    }
}

#[test]
fn rebinding_refuses_symlinks_out_of_the_kubelet_dir() {
    let s = setup();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("vol")).unwrap();
    std::os::unix::fs::symlink(outside.path(), s.dir.path().join("kubelet/pods/evil")).unwrap();
    let want = s.want(&s.spec(&[("kubelet/pods/evil/vol", false)]));
    let served = s.serve(&want);
    assert_eq!(served.rebound, 0);
    assert_eq!(served.rebind_errors.len(), 1, "{:?}", served.rebind_errors);
    assert!(s.fake.top(&outside.path().join("vol")).is_none());
}

#[test]
fn teardown_stops_unmounts_and_forgets() {
    let s = setup();
    let want = s.want(&s.spec(&[]));
    let served = s.serve(&want);
    s.host.teardown("vol1", &want.mountpoint).unwrap();
    assert_eq!(
        s.fake.w().signals,
        vec![(served.daemon.unwrap().pid, Signal::SIGTERM)]
    );
    assert!(s.fake.w().table.is_empty());
    assert!(!s.mountpoint().exists());
    assert_eq!(s.host.state.load("vol1").unwrap(), None);
    // Idempotent.
    s.host.teardown("vol1", &want.mountpoint).unwrap();
    // A crashed daemon's broken mount is detached too.
    let served = s.serve(&want);
    s.fake.crash(served.daemon.unwrap().pid);
    s.host.teardown("vol1", &want.mountpoint).unwrap();
    assert!(s.fake.w().table.is_empty());
}

#[test]
fn remove_data_never_follows_symlinks_out() {
    let s = setup();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), "keep").unwrap();
    let data = s.dir.path().join("backend/vol1");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("sub/file"), "x").unwrap();
    std::os::unix::fs::symlink(outside.path(), data.join("link")).unwrap();
    let src = data.display().to_string();
    assert!(s.host.remove_data(&src, "vol1").unwrap());
    assert!(!data.exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("precious")).unwrap(),
        "keep"
    );
    assert!(!s.host.remove_data(&src, "vol1").unwrap(), "already gone");
    for bad in ["/", "relative", "/a/../b", ""] {
        assert!(s.host.remove_data(bad, "vol1").is_err(), "{bad:?}");
    }
}

#[test]
fn remove_data_is_refused_while_mounted_here() {
    let s = setup();
    let spec = s.spec(&[]);
    s.serve(&s.want(&spec));
    let err = s.host.remove_data(&spec.source, "vol1").unwrap_err();
    assert!(matches!(err, Error::StillMounted { .. }), "{err}");
    assert!(Path::new(&spec.source).exists());
}

#[test]
fn nothing_outside_the_allowed_backend_roots_is_served_or_removed() {
    let s = setup();
    // What a Volume with `backend.root: /etc` would name: here a directory outside
    // the allowed root `<dir>/backend`.
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("vol1");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("passwd"), "root:x:0:0").unwrap();
    let mut spec = s.spec(&[]);
    spec.source = victim.display().to_string();
    let refused = want("vol1-n1", &spec, &s.host.config);
    assert!(refused.is_err(), "served: {refused:?}");
    assert!(s.host.remove_data(&spec.source, "vol1").is_err());
    assert!(
        victim.join("passwd").exists(),
        "data outside the root removed"
    );
    // The root itself, or another volume's directory, is no source of vol1.
    for bad in ["backend", "backend/other"] {
        spec.source = s.dir.path().join(bad).display().to_string();
        assert!(want("vol1-n1", &spec, &s.host.config).is_err(), "{bad}");
        assert!(s.host.remove_data(&spec.source, "vol1").is_err(), "{bad}");
    }
    assert!(s.dir.path().join("backend").is_dir());
}

#[test]
fn mount_options_outside_the_allowed_list_are_refused_by_the_agent_too() {
    let s = setup();
    for bad in ["suid", "dev", "fsname=/etc", "ro,suid", ""] {
        let mut spec = s.spec(&[]);
        spec.mount_options = vec!["noatime".into(), bad.into()];
        let err = want("vol1-abc", &spec, &s.host.config)
            .err()
            .unwrap_or_else(|| panic!("{bad:?} accepted"));
        assert!(err.starts_with("spec.mountOptions:"), "{err}");
    }
    let mut spec = s.spec(&[]);
    spec.mount_options = vec!["noatime".into(), "nosuid".into(), "ro".into()];
    s.want(&spec);
}

/// A daemon is told where the fd holder is whether or not it answers at the daemon's
/// start: the daemon hands its descriptor over once the holder answers (retrying), so
/// a holder that comes up late (pod mode: its DaemonSet restarting) still makes the
/// daemon's crash a takeover, not a remount. Only an agent without a holder says none.
#[test]
fn the_holder_is_given_to_every_daemon_even_one_started_while_it_does_not_answer() {
    // (what, the agent has a holder, it answers)
    let table = [
        ("no holder", false, false),
        ("a holder that does not answer", true, false),
        ("a holder that answers", true, true),
    ];
    for (what, has_holder, answers) in table {
        let mut s = setup();
        let socket = s.dir.path().join("state/holder.sock");
        s.host.holder = has_holder.then(|| Arc::new(HolderProcess::connect_only(socket.clone())));
        let _serving = answers.then(|| tessera_fuse::fd_holder::Holder::serve(&socket).unwrap());
        let served = s.serve(&s.want(&s.spec(&[])));
        assert!(served.answers, "{what}");
        let started = s.fake.w().started[0].handoff.clone();
        let want = has_holder.then(|| (socket.clone(), s.host.state.handoff_file("vol1")));
        assert_eq!(started, want, "{what}");
    }
}
