//! Waking a side that sleeps on a queue, without losing the wake-up.
//!
//! One side would sleep until a queue has something for it: the daemon's
//! command processor until a program publishes a work request (the
//! program then rings a doorbell), a program until its CQ gets a
//! completion (`ibv_req_notify_cq`, then its completion channel). The
//! sleeper raises a request in a shared word and looks at the queue once
//! more before it sleeps; the publisher publishes its entry and then reads
//! the request, answering it if raised.
//!
//! Each side stores one word and then loads the other's (Dekker's
//! pattern), and only a sequentially consistent fence between the store
//! and the load orders them: release and acquire do not, and x86 too lets
//! a load pass the thread's own earlier store (still in its store
//! buffer). Without the fences both can look too early, so that the
//! sleeper finds no entry, the publisher finds no request, and the
//! sleeper sleeps with work waiting. With them at least one of the two
//! sees the other's store. The model checker runs both (see the tests).

use std::sync::atomic::Ordering::Relaxed;

use crate::Word;

/// The sleeper asks to be woken (`request` is not 0; what it means is the
/// caller's, as "the next completion" or "the next solicited one"). Look
/// at the queue once more afterwards: an entry published before the
/// publisher could see the request is found there.
pub fn request<W: Word>(word: &W, request: u64) {
    word.store(request, Relaxed);
    W::fence();
}

/// The sleeper, awake again, withdraws its request.
pub fn withdraw<W: Word>(word: &W) {
    word.store(0, Relaxed);
}

/// The publisher, after publishing: the request standing, 0 for none.
pub fn requested<W: Word>(word: &W) -> u64 {
    W::fence();
    word.load(Relaxed)
}

/// The publisher answers the request: takes it, so that one request gets
/// one wake-up. Returns it, or 0 when there was none any more (another
/// publisher took it).
pub fn take<W: Word>(word: &W) -> u64 {
    word.swap(0)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn a_request_is_answered_once() {
        let word = AtomicU64::new(0);
        assert_eq!(requested(&word), 0);
        request(&word, 2);
        assert_eq!(requested(&word), 2);
        assert_eq!(take(&word), 2);
        assert_eq!(take(&word), 0, "taken already");
        request(&word, 1);
        withdraw(&word);
        assert_eq!(requested(&word), 0);
    }
}

#[cfg(all(test, loom))]
mod model {
    use std::sync::atomic::Ordering::{Acquire, Release};

    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64;

    use super::*;

    /// The queue (its producer index) and the request word.
    #[derive(Default)]
    struct Shared {
        produced: AtomicU64,
        request: AtomicU64,
    }

    /// One sleeper, one publisher: the sleeper asks, looks once more and
    /// would sleep if it found nothing; the publisher publishes and wakes
    /// it if asked. Whatever the interleaving, the sleeper finds the entry
    /// or is woken. `ask` and `asked` are the two halves under test.
    fn sleeper_against_publisher(ask: fn(&AtomicU64), asked: fn(&AtomicU64) -> u64) {
        loom::model(move || {
            let shared = Arc::new(Shared::default());
            let publisher = {
                let shared = shared.clone();
                loom::thread::spawn(move || {
                    shared.produced.store(1, Release);
                    asked(&shared.request) != 0 && take(&shared.request) != 0
                })
            };
            ask(&shared.request);
            let found = shared.produced.load(Acquire) == 1;
            let woken = publisher.join().unwrap();
            assert!(found || woken, "the sleeper would sleep with an entry waiting");
        });
    }

    #[test]
    fn the_sleeper_finds_the_entry_or_is_woken() {
        sleeper_against_publisher(|word| request(word, 1), requested);
    }

    /// The same protocol with release and acquire in place of the fences
    /// loses the wake-up, and the model finds it: the check above can fail.
    #[test]
    #[should_panic(expected = "the sleeper would sleep with an entry waiting")]
    fn without_the_fences_the_wake_up_is_lost() {
        sleeper_against_publisher(|word| word.store(1, Release), |word| word.load(Acquire));
    }
}
