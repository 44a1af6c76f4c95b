use std::time::Duration;

/// What can go wrong with a verb.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Verbs(#[from] softrnic_transport::VerbsError),
    #[error(transparent)]
    Open(#[from] softrnic_engine::OpenError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("invalid address: {0}")]
    Address(#[from] std::net::AddrParseError),
    #[error("no completion within {0:?}")]
    Timeout(Duration),
    #[error("exchange with the peer failed: {0}")]
    Exchange(String),
    #[error("bad configuration: {0}")]
    Config(String),
}

impl From<softrnic_provider::OpenError> for Error {
    fn from(e: softrnic_provider::OpenError) -> Error {
        match e {
            softrnic_provider::OpenError::Daemon(e) => Error::Verbs(e),
            softrnic_provider::OpenError::Engine(softrnic_engine::OpenError::Config(why)) => Error::Config(why),
            softrnic_provider::OpenError::Engine(e) => Error::Open(e),
        }
    }
}
