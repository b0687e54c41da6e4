//! The self-fencing check at the head of every request that changes or commits the
//! volume (see `crate::fence_gate`).

/// Reply EIO and return when the mount's node lost its Lease; wait while it is
/// fenced (see `crate::fence_gate`).
macro_rules! fenced {
    ($self:ident, $reply:ident) => {
        if let Some(g) = &$self.options.fence
            && g.admit().is_err()
        {
            counters::table().error(libc::EIO);
            return $reply.error(Errno::EIO);
        }
    };
}
