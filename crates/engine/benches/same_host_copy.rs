//! How a payload could move between two processes on one host, measured
//! side by side in one run (issue 32, item 3: choose the one-copy
//! mechanism by measurement). Per 64 KiB message, each way's rate and
//! its ratio to a plain `memcpy` of the same bytes:
//!
//! - **four copies**, the shared-memory wire today: each 4 KiB packet out
//!   of the source region into a datagram, into the ring's slot, out of
//!   it, into the destination region, every copy the relaxed-atomic word
//!   loop that memory shared with a program (or another process) needs;
//! - **one copy through a shared mapping**: the destination's engine
//!   reads the source region where it maps it (a memfd passed over the
//!   inbox's socket, or a region registered in shared memory, as
//!   softrnicd's tenants' are), one atomic copy a packet;
//! - **`process_vm_readv`**: the kernel copies from the source process's
//!   memory straight into the destination region, a call per 4 KiB
//!   packet, or a call per message.
//!
//! The source is another process (a child forked with the buffer), so
//! the kernel's cross-process path (`get_user_pages_remote`) is what
//! `process_vm_readv` pays.
//!
//!     cargo bench -p softrnic-engine --bench same_host_copy

use std::time::Instant;

use softrnic_transport::DmaBuffer;

const MESSAGE: usize = 64 << 10;
const PACKET: usize = 4096;
/// Messages per measurement, and measurements (the median is shown).
const MESSAGES: usize = 20_000;
const ROUNDS: usize = 5;

/// The child holding the source bytes: it waits to be killed.
struct Source {
    pid: libc::pid_t,
}

impl Source {
    /// Forks now, while the process has one thread.
    fn fork() -> Source {
        // SAFETY: called before any thread exists; the child only calls
        // pause(), which is async-signal-safe, until SIGKILL.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            loop {
                // SAFETY: pause takes nothing and returns on a signal.
                unsafe { libc::pause() };
            }
        }
        Source { pid }
    }

    /// Copies `len` bytes at `from` in the child into `to`, in calls of
    /// `piece` bytes.
    fn read(&self, from: usize, to: &DmaBuffer, len: usize, piece: usize) {
        for at in (0..len).step_by(piece) {
            let local = libc::iovec { iov_base: to.as_ptr().wrapping_add(at).cast(), iov_len: piece };
            let remote = libc::iovec { iov_base: (from + at) as *mut libc::c_void, iov_len: piece };
            // SAFETY: `local` lies inside `to` (a live buffer of at least
            // `len` bytes); the kernel writes it as a device's DMA would,
            // and checks `remote` against the child's address space.
            let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
            assert_eq!(n, piece as isize, "process_vm_readv: {}", std::io::Error::last_os_error());
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        // SAFETY: our own child, killed and reaped once.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// GB/s of `copy` moving one message, the median of the rounds.
fn rate(mut copy: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..MESSAGES {
                copy();
            }
            (MESSAGES * MESSAGE) as f64 / started.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() {
    let pattern: Vec<u8> = (0..MESSAGE).map(|i| (i * 7 + 3) as u8).collect();
    let region = DmaBuffer::from_bytes(&pattern);
    let source = Source::fork();
    let (ring, destination) = (DmaBuffer::new(PACKET), DmaBuffer::new(MESSAGE));
    let (mut datagram, mut arrived, mut plain) = (vec![0u8; PACKET], vec![0u8; PACKET], vec![0u8; MESSAGE]);

    let results = [
        ("memcpy, the floor", rate(|| plain.copy_from_slice(std::hint::black_box(&pattern)))),
        (
            "four atomic copies a packet (the shared-memory wire now)",
            rate(|| {
                for at in (0..MESSAGE).step_by(PACKET) {
                    region.read(at, &mut datagram);
                    ring.write(0, &datagram);
                    ring.read(0, &mut arrived);
                    destination.write(at, &arrived);
                }
            }),
        ),
        (
            "one atomic copy a packet (a shared mapping of the region)",
            rate(|| {
                for at in (0..MESSAGE).step_by(PACKET) {
                    destination.write(at, &pattern[at..at + PACKET]);
                }
            }),
        ),
        (
            "process_vm_readv, a call a packet",
            rate(|| source.read(region.as_ptr() as usize, &destination, MESSAGE, PACKET)),
        ),
        (
            "process_vm_readv, a call a message",
            rate(|| source.read(region.as_ptr() as usize, &destination, MESSAGE, MESSAGE)),
        ),
    ];
    let mut check = vec![0u8; MESSAGE];
    destination.read(0, &mut check);
    assert!(check == pattern, "the last copy landed the source's bytes");

    let floor = results[0].1;
    println!("64 KiB messages, {MESSAGES} a round, median of {ROUNDS} rounds:");
    for (name, gbps) in results {
        println!("  {name:58} {gbps:6.2} GB/s  {:.2}x memcpy", gbps / floor);
    }
}
