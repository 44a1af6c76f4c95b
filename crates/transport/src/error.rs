//! Errors that a verb returns synchronously to its caller. Errors that
//! happen later, on the wire, arrive as completions with a status instead.

/// Why a verb refused its arguments. Each variant maps to the errno that
/// libibverbs would return ([`VerbsError::errno`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// An argument is out of range or missing (EINVAL).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A queue is full or a limit is reached (ENOMEM).
    #[error("out of resources: {0}")]
    OutOfResources(String),
    /// The handle names nothing that exists (EINVAL in verbs).
    #[error("no such {0}")]
    NotFound(&'static str),
    /// The object is still in use by another (EBUSY).
    #[error("{0} is still in use")]
    Busy(&'static str),
    /// The operation is not supported on this object (EOPNOTSUPP).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The caller may not do this (EPERM): it is the privileged QP's.
    #[error("not permitted: {0}")]
    PermissionDenied(String),
    /// The device itself failed: the daemon serving it went away.
    #[error("device error: {0}")]
    Device(String),
}

impl VerbsError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        VerbsError::InvalidArgument(msg.into())
    }

    /// The errno libibverbs uses for this error.
    pub fn errno(&self) -> i32 {
        match self {
            VerbsError::InvalidArgument(_) | VerbsError::NotFound(_) => 22, // EINVAL
            VerbsError::OutOfResources(_) => 12,                            // ENOMEM
            VerbsError::Busy(_) => 16,                                      // EBUSY
            VerbsError::NotSupported(_) => 95,                              // EOPNOTSUPP
            VerbsError::PermissionDenied(_) => 1,                           // EPERM
            VerbsError::Device(_) => 5,                                     // EIO
        }
    }
}

pub type Result<T> = core::result::Result<T, VerbsError>;
