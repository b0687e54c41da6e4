//! The permission decisions the daemon makes itself, and the caller's supplementary
//! groups they need.
//!
//! The kernel checks permissions before a request arrives (`default_permissions`),
//! with the caller's full credentials. A few decisions are the daemon's own: `create`
//! without `O_EXCL` of a name another node made meanwhile opens it, so the file's
//! mode bits are checked here (`open_existing`), and `access(2)` on a mount without
//! `default_permissions`; a write or truncation by a caller without `CAP_FSETID`
//! clears set-user/group-ID bits here (`FUSE_HANDLE_KILLPRIV_V2`). The backend would
//! decide with the caller's fsuid, fsgid **and supplementary groups** (a Pod's
//! `fsGroup` is one), so [`permits`] does too, exactly as the kernel's
//! `acl_permission_check` reads mode bits: owner class if the fsuid owns the file;
//! else group class if the caller is in the file's group, but only asked for when
//! group and other bits differ in what is wanted; else other. [`kept_after_write`]
//! is the kernel's `setattr_should_drop_suidgid`.
//!
//! **Where the groups come from.** The request header has the caller's fsuid, fsgid
//! and pid (as the mounter's pid namespace sees it), not its groups. They are read from
//! `Groups:` of `/proc/<pid>/status` ([`of_process`]), and only when the fsuid/fsgid
//! check cannot decide (no `/proc` read on a path where it is not needed). The
//! kernel's `FUSE_EXT_GROUPS` extension (`FUSE_CREATE_SUPP_GROUP`) does not do: it
//! comes with create-type requests only (not writes, truncations or `access`), and
//! carries at most one group, the parent directory's, and only when the caller is in
//! it; what is needed is membership of the *file's* group, which is the parent's in
//! a set-group-ID `fsGroup` directory but not in general (and fuser does not pass
//! request extensions on).
//!
//! **Race and pid namespaces.** The status is taken only if its fsuid and fsgid are
//! the request's: a pid reused by another process could then only lend the groups of
//! a process with the very same ids, and the caller's thread waits in the request
//! until it is answered (it leaves only if killed, and the pid must then be reused
//! within the request's lifetime). A pidfd would not close this: it is opened from
//! the same number, after the fact.
//! The pid is 0 when the caller is in a pid namespace the mounter cannot see: mount
//! Pods therefore run with `hostPID` (`crates/tessera-node/src/pods/spec.rs`), as daemons of
//! `--mount-mode=process` run in the agent's host pid namespace.
//!
//! **Fail safe.** When the groups cannot be known (pid 0, the process gone, ids that
//! do not match, an unreadable or malformed status), the caller counts as in the
//! file's group only for what both group and other bits allow: never more than the
//! backend would grant, and, for the usual modes (group bits a superset of other),
//! exactly what the fsuid/fsgid check alone gave; and a set-group-ID bit a member
//! would keep goes.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use super::Caller;

/// The kernel's limit on supplementary groups (`NGROUPS_MAX`).
pub const NGROUPS_MAX: usize = 65536;

/// Bytes of `/proc/<pid>/status` read at most: the other lines are a few KiB, and
/// `NGROUPS_MAX` groups of up to 10 digits and a space under 704 KiB.
const STATUS_MAX: u64 = 1 << 20;

/// What `/proc/<pid>/status` says of a process's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusIds {
    pub fsuid: u32,
    pub fsgid: u32,
    pub groups: Vec<u32>,
}

/// Why a status gives no groups.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatusError {
    #[error("no {0} line")]
    Missing(&'static str),
    #[error("malformed {0} line")]
    Malformed(&'static str),
    #[error("more than {NGROUPS_MAX} groups")]
    TooManyGroups,
}

/// Parse the `Uid:`, `Gid:` and `Groups:` lines of a `/proc/<pid>/status`. Pure.
pub fn parse_status(text: &[u8]) -> Result<StatusIds, StatusError> {
    let (mut uid, mut gid, mut groups) = (None, None, None);
    for line in text.split(|&b| b == b'\n') {
        if let Some(rest) = line.strip_prefix(b"Uid:") {
            uid = Some(fs_id(rest).ok_or(StatusError::Malformed("Uid"))?);
        } else if let Some(rest) = line.strip_prefix(b"Gid:") {
            gid = Some(fs_id(rest).ok_or(StatusError::Malformed("Gid"))?);
        } else if let Some(rest) = line.strip_prefix(b"Groups:") {
            groups = Some(group_list(rest)?);
        }
        if uid.is_some() && gid.is_some() && groups.is_some() {
            break;
        }
    }
    Ok(StatusIds {
        fsuid: uid.ok_or(StatusError::Missing("Uid"))?,
        fsgid: gid.ok_or(StatusError::Missing("Gid"))?,
        groups: groups.ok_or(StatusError::Missing("Groups"))?,
    })
}

/// The fourth of `real effective saved fs` ids.
fn fs_id(rest: &[u8]) -> Option<u32> {
    let mut ids = rest
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty());
    let fs = ids.nth(3)?;
    ids.next().is_none().then_some(())?;
    number(fs)
}

fn group_list(rest: &[u8]) -> Result<Vec<u32>, StatusError> {
    let mut groups = Vec::new();
    for w in rest
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty())
    {
        if groups.len() == NGROUPS_MAX {
            return Err(StatusError::TooManyGroups);
        }
        groups.push(number(w).ok_or(StatusError::Malformed("Groups"))?);
    }
    Ok(groups)
}

fn number(w: &[u8]) -> Option<u32> {
    if w.is_empty() || w.len() > 10 || !w.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(w).ok()?.parse().ok()
}

/// The supplementary groups of the caller's process, or `None` when they cannot be
/// known (see the module doc). Reads `/proc`: call only when needed.
pub fn of_process(caller: Caller) -> Option<Vec<u32>> {
    if caller.pid == 0 {
        return None;
    }
    let read = || -> std::io::Result<Vec<u8>> {
        let f = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(format!("/proc/{}/status", caller.pid))?;
        let mut text = Vec::new();
        f.take(STATUS_MAX).read_to_end(&mut text)?;
        Ok(text)
    };
    let text = match read() {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(pid = caller.pid, error = %e, "caller's groups unknown");
            return None;
        }
    };
    match parse_status(&text) {
        Ok(ids) if ids.fsuid == caller.uid && ids.fsgid == caller.gid => Some(ids.groups),
        Ok(ids) => {
            tracing::debug!(
                pid = caller.pid,
                fsuid = ids.fsuid,
                fsgid = ids.fsgid,
                "caller's pid now has other ids: groups unknown"
            );
            None
        }
        Err(e) => {
            tracing::debug!(pid = caller.pid, error = %e, "caller's groups unknown");
            None
        }
    }
}

/// Whether `caller` may have `mask` (`R_OK|W_OK|X_OK` bits) on an inode of
/// `owner:group` and `mode`, from the mode bits, as the kernel decides for a caller
/// without capabilities (root is the caller's business). `groups` gives the caller's
/// supplementary groups (`None`: unknown); it is called only when membership decides.
/// Pure but for `groups`.
pub fn permits(
    caller: Caller,
    (owner, group, mode): (u32, u32, u32),
    mask: u32,
    groups: impl FnOnce() -> Option<Vec<u32>>,
) -> bool {
    let mask = mask & 7;
    let allowed = |bits: u32| bits & mask == mask;
    if caller.uid == owner {
        return allowed((mode >> 6) & 7);
    }
    let (grp, other) = ((mode >> 3) & 7, mode & 7);
    if mask & (grp ^ other) == 0 || caller.gid == group {
        return allowed(if caller.gid == group { grp } else { other });
    }
    match groups() {
        Some(g) if g.contains(&group) => allowed(grp),
        Some(_) => allowed(other),
        None => allowed(grp & other),
    }
}

/// The mode bits (`0o7777`) left after a write or truncation by `caller`, who lacks
/// `CAP_FSETID`, of a file of `group` and `mode`, as the kernel's
/// `setattr_should_drop_suidgid` has them: set-user-ID goes; set-group-ID goes if
/// group-executable, or else (it then marks mandatory locking) if the caller is not in
/// the file's group. Unknown groups count as not in it: the bit goes. Pure but for
/// `groups`, called only when membership decides.
pub fn kept_after_write(
    caller: Caller,
    (group, mode): (u32, u32),
    groups: impl FnOnce() -> Option<Vec<u32>>,
) -> u32 {
    let mut keep = mode & 0o7777 & !libc::S_ISUID;
    if mode & libc::S_ISGID != 0
        && (mode & libc::S_IXGRP != 0
            || (caller.gid != group && !groups().is_some_and(|g| g.contains(&group))))
    {
        keep &= !libc::S_ISGID;
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &[u8] = b"Name:\tsh\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\n\
        Uid:\t1000\t1001\t1002\t1003\nGid:\t2000\t2001\t2002\t2003\nFDSize:\t64\n\
        Groups:\t3000 4000 \nNStgid:\t42\n";

    fn ids(fsuid: u32, fsgid: u32, groups: &[u32]) -> Result<StatusIds, StatusError> {
        Ok(StatusIds {
            fsuid,
            fsgid,
            groups: groups.to_vec(),
        })
    }

    #[test]
    fn status_parsing() {
        let many = |n: usize| {
            let mut s = b"Uid:\t1 1 1 1\nGid:\t2 2 2 2\nGroups:\t".to_vec();
            for g in 0..n {
                s.extend_from_slice(format!("{g} ").as_bytes());
            }
            s.push(b'\n');
            s
        };
        let all: Vec<u32> = (0..NGROUPS_MAX as u32).collect();
        let cases: Vec<(&str, Vec<u8>, Result<StatusIds, StatusError>)> = vec![
            (
                "fs ids and groups",
                STATUS.to_vec(),
                ids(1003, 2003, &[3000, 4000]),
            ),
            (
                "no groups",
                b"Uid:\t5 5 5 5\nGid:\t6 6 6 6\nGroups:\t\n".to_vec(),
                ids(5, 6, &[]),
            ),
            (
                "no trailing newline",
                b"Uid:\t5 5 5 5\nGid:\t6 6 6 6\nGroups:\t7".to_vec(),
                ids(5, 6, &[7]),
            ),
            (
                "largest id",
                b"Uid:\t0 0 0 4294967295\nGid:\t0 0 0 0\nGroups:\t4294967295\n".to_vec(),
                ids(u32::MAX, 0, &[u32::MAX]),
            ),
            ("NGROUPS_MAX groups", many(NGROUPS_MAX), ids(1, 2, &all)),
            (
                "more than NGROUPS_MAX",
                many(NGROUPS_MAX + 1),
                Err(StatusError::TooManyGroups),
            ),
            (
                "no Groups line",
                b"Uid:\t5 5 5 5\nGid:\t6 6 6 6\n".to_vec(),
                Err(StatusError::Missing("Groups")),
            ),
            (
                "no Uid line",
                b"Gid:\t6 6 6 6\nGroups:\t\n".to_vec(),
                Err(StatusError::Missing("Uid")),
            ),
            (
                "three ids",
                b"Uid:\t5 5 5\nGid:\t6 6 6 6\nGroups:\t\n".to_vec(),
                Err(StatusError::Malformed("Uid")),
            ),
            (
                "five ids",
                b"Uid:\t5 5 5 5\nGid:\t6 6 6 6 6\nGroups:\t\n".to_vec(),
                Err(StatusError::Malformed("Gid")),
            ),
            (
                "id past u32",
                b"Uid:\t5 5 5 5\nGid:\t6 6 6 6\nGroups:\t4294967296\n".to_vec(),
                Err(StatusError::Malformed("Groups")),
            ),
            (
                "sign",
                b"Uid:\t5 5 5 5\nGid:\t6 6 6 6\nGroups:\t+7\n".to_vec(),
                Err(StatusError::Malformed("Groups")),
            ),
            (
                "long digits",
                b"Uid:\t5 5 5 5\nGid:\t6 6 6 6\nGroups:\t00000000007\n".to_vec(),
                Err(StatusError::Malformed("Groups")),
            ),
            ("empty", Vec::new(), Err(StatusError::Missing("Uid"))),
        ];
        for (name, text, want) in cases {
            assert_eq!(parse_status(&text), want, "{name}");
        }
    }

    const U: Caller = Caller {
        uid: 1000,
        gid: 1000,
        pid: 0,
    };
    const R: u32 = libc::R_OK as u32;
    const W: u32 = libc::W_OK as u32;
    const RW: u32 = R | W;

    /// What the caller's groups are, as `permits` would learn them.
    #[derive(Debug, Clone, Copy)]
    enum Groups {
        In,
        NotIn,
        Unknown,
        /// Must not be asked for: membership does not decide.
        NotAsked,
    }

    #[test]
    fn mode_bits_with_groups() {
        use Groups::*;
        // (case, owner, group, mode, mask, groups, permitted)
        let cases = [
            ("owner class only", 1000, 3000, 0o066, R, NotAsked, false),
            ("owner rw", 1000, 3000, 0o600, RW, NotAsked, true),
            ("fsgid is the group", 2001, 1000, 0o660, RW, NotAsked, true),
            (
                "fsgid, group bits win",
                2001,
                1000,
                0o606,
                R,
                NotAsked,
                false,
            ),
            ("supplementary group", 2001, 3000, 0o660, RW, In, true),
            ("not in the group", 2001, 3000, 0o660, RW, NotIn, false),
            ("unknown groups deny", 2001, 3000, 0o660, RW, Unknown, false),
            ("group read only", 2001, 3000, 0o640, RW, In, false),
            ("group read", 2001, 3000, 0o640, R, In, true),
            ("bits agree", 2001, 3000, 0o664, R, NotAsked, true),
            ("bits agree, deny", 2001, 3000, 0o660, 0o1, NotAsked, false),
            (
                "group denies what other allows",
                2001,
                3000,
                0o606,
                R,
                In,
                false,
            ),
            ("other allows", 2001, 3000, 0o606, R, NotIn, true),
            (
                "unknown: both must allow",
                2001,
                3000,
                0o606,
                R,
                Unknown,
                false,
            ),
            (
                "unknown: only common bits",
                2001,
                3000,
                0o664,
                RW,
                Unknown,
                false,
            ),
            ("unknown: common bits", 2001, 3000, 0o664, R, NotAsked, true),
            ("nothing asked", 2001, 3000, 0o000, 0, NotAsked, true),
        ];
        for (name, owner, group, mode, mask, groups, want) in cases {
            let got = permits(U, (owner, group, mode), mask, || match groups {
                In => Some(vec![5, group, 7]),
                NotIn => Some(vec![5, 7]),
                Unknown => None,
                NotAsked => panic!("{name}: groups asked for"),
            });
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn set_id_bits_after_a_write() {
        use Groups::*;
        // (case, group, mode, groups, kept)
        let cases = [
            ("suid goes", 3000, 0o4755, NotAsked, 0o755),
            ("sgid and group x goes", 3000, 0o2775, NotAsked, 0o775),
            ("sgid, fsgid's group", 1000, 0o2664, NotAsked, 0o2664),
            ("sgid, in the group", 3000, 0o2664, In, 0o2664),
            ("sgid, not in the group", 3000, 0o2664, NotIn, 0o664),
            ("sgid, unknown groups", 3000, 0o2664, Unknown, 0o664),
            ("both", 3000, 0o6664, In, 0o2664),
            ("plain", 3000, 0o100644, NotAsked, 0o644),
        ];
        for (name, group, mode, groups, want) in cases {
            let got = kept_after_write(U, (group, mode), || match groups {
                In => Some(vec![group]),
                NotIn => Some(vec![]),
                Unknown => None,
                NotAsked => panic!("{name}: groups asked for"),
            });
            assert_eq!(got, want, "{name}: {got:o}");
        }
    }

    #[test]
    fn groups_of_this_process() {
        // SAFETY: plain id getters.
        let (uid, gid, pid) = unsafe { (libc::geteuid(), libc::getegid(), libc::getpid()) };
        let me = Caller {
            uid,
            gid,
            pid: pid as u32,
        };
        // SAFETY: a count only, no buffer.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        let mut want = vec![0; n as usize];
        // SAFETY: the buffer holds n groups.
        let n = unsafe { libc::getgroups(n, want.as_mut_ptr()) };
        want.truncate(n as usize);
        assert_eq!(of_process(me), Some(want));
        let other = Caller {
            uid: uid.wrapping_add(1),
            ..me
        };
        assert_eq!(of_process(other), None, "ids that do not match");
        assert_eq!(of_process(Caller { pid: 0, ..me }), None, "pid 0");
    }
}
