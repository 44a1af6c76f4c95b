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

/// A list of send requests refused part way ([`QueuePair::post_send_list`]):
/// the first `posted` were posted and will run; the one after them was
/// refused for `error`, and none after it was looked at (`ibv_post_send`'s
/// `bad_wr`).
///
/// [`QueuePair::post_send_list`]: crate::QueuePair::post_send_list
#[derive(Debug, thiserror::Error)]
#[error("work request {posted} of the list (counting from 0) was refused: {error}")]
pub struct PostListError {
    pub posted: usize,
    #[source]
    pub error: Error,
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
