//! An rsocket's options (`rsetsockopt`, `rgetsockopt`, `rfcntl`): the
//! socket levels programs set on any TCP socket, and rsockets' own
//! `SOL_RDMA`.
//!
//! What softrnic's stream does with each: `SO_SNDBUF`/`SO_RCVBUF` (and
//! `RDMA_SQSIZE`/`RDMA_RQSIZE`, the same in slots) size the registered
//! buffers of a connection made afterwards; `RDMA_IOMAPSIZE` bounds
//! `riomap`; `TCP_NODELAY` is what the stream always does (a message
//! leaves when sent); `RDMA_INLINE` is kept for the record (every send is
//! copied into a registered slot, so inline data would change nothing);
//! `SO_KEEPALIVE` and its timers are kept and reported, and a dead peer is
//! found by the next message's retries (RC's own), not by probes;
//! `RDMA_ROUTE` is accepted and unused (softrnic resolves routes itself).

use std::ffi::c_int;

use super::stream::{DEFAULT_BUFFER, SLOT_BYTES};

/// `<rdma/rsocket.h>`'s level and names.
pub const SOL_RDMA: c_int = 0x10000;
pub const RDMA_SQSIZE: c_int = 0;
pub const RDMA_RQSIZE: c_int = 1;
pub const RDMA_INLINE: c_int = 2;
pub const RDMA_IOMAPSIZE: c_int = 3;
pub const RDMA_ROUTE: c_int = 4;

/// The inline size rsockets report by default.
const DEFAULT_INLINE: c_int = 64;

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub nonblocking: bool,
    pub send_buffer: usize,
    pub receive_buffer: usize,
    pub reuse_addr: bool,
    pub keepalive: bool,
    pub keep_idle: c_int,
    pub no_delay: bool,
    pub linger: libc::linger,
    pub inline: c_int,
    pub iomap_size: c_int,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            nonblocking: false,
            send_buffer: DEFAULT_BUFFER,
            receive_buffer: DEFAULT_BUFFER,
            reuse_addr: false,
            keepalive: false,
            keep_idle: 7200,
            no_delay: false,
            linger: libc::linger { l_onoff: 0, l_linger: 0 },
            inline: DEFAULT_INLINE,
            iomap_size: 0,
        }
    }
}

/// An option's value, as `rgetsockopt` writes it.
pub enum Value {
    Int(c_int),
    Linger(libc::linger),
}

impl Options {
    /// Sets `level`/`name` from the program's `value` bytes.
    pub fn set(&mut self, level: c_int, name: c_int, value: &[u8]) -> Result<(), c_int> {
        let int = || -> Result<c_int, c_int> {
            value.get(..4).map(|b| c_int::from_ne_bytes(b.try_into().expect("four bytes"))).ok_or(libc::EINVAL)
        };
        let size = |v: c_int| usize::try_from(v).map_err(|_| libc::EINVAL);
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => self.reuse_addr = int()? != 0,
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => self.keepalive = int()? != 0,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => self.send_buffer = size(int()?)?,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => self.receive_buffer = size(int()?)?,
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                let bytes = value.get(..8).ok_or(libc::EINVAL)?;
                let word = |at: usize| c_int::from_ne_bytes(bytes[at..at + 4].try_into().expect("four bytes"));
                self.linger = libc::linger { l_onoff: word(0), l_linger: word(4) };
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => self.no_delay = int()? != 0,
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => self.keep_idle = int()?,
            (SOL_RDMA, RDMA_SQSIZE) => self.send_buffer = size(int()?)? * SLOT_BYTES,
            (SOL_RDMA, RDMA_RQSIZE) => self.receive_buffer = size(int()?)? * SLOT_BYTES,
            (SOL_RDMA, RDMA_INLINE) => self.inline = int()?,
            (SOL_RDMA, RDMA_IOMAPSIZE) => self.iomap_size = int()?.max(0),
            (SOL_RDMA, RDMA_ROUTE) => {}
            _ => return Err(libc::ENOPROTOOPT),
        }
        Ok(())
    }

    /// The value of `level`/`name` (`SO_ERROR` and `SO_TYPE` are the
    /// socket's, not options: the caller answers those).
    pub fn get(&self, level: c_int, name: c_int) -> Result<Value, c_int> {
        let int = |v: usize| Value::Int(v.min(c_int::MAX as usize) as c_int);
        Ok(match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => Value::Int(self.reuse_addr.into()),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => Value::Int(self.keepalive.into()),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => int(self.send_buffer),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => int(self.receive_buffer),
            (libc::SOL_SOCKET, libc::SO_LINGER) => Value::Linger(self.linger),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => Value::Int(self.no_delay.into()),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => Value::Int(self.keep_idle),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => int(SLOT_BYTES),
            (SOL_RDMA, RDMA_SQSIZE) => int(self.send_buffer / SLOT_BYTES),
            (SOL_RDMA, RDMA_RQSIZE) => int(self.receive_buffer / SLOT_BYTES),
            (SOL_RDMA, RDMA_INLINE) => Value::Int(self.inline),
            (SOL_RDMA, RDMA_IOMAPSIZE) => Value::Int(self.iomap_size),
            _ => return Err(libc::ENOPROTOOPT),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get_int(options: &Options, level: c_int, name: c_int) -> c_int {
        match options.get(level, name) {
            Ok(Value::Int(v)) => v,
            _ => panic!("an int option"),
        }
    }

    #[test]
    fn buffer_sizes_are_bytes_at_the_socket_level_and_slots_at_sol_rdma() {
        let mut options = Options::default();
        options.set(libc::SOL_SOCKET, libc::SO_SNDBUF, &(1_i32 << 19).to_ne_bytes()).unwrap();
        assert_eq!(get_int(&options, SOL_RDMA, RDMA_SQSIZE), (1 << 19) / SLOT_BYTES as c_int);
        options.set(SOL_RDMA, RDMA_RQSIZE, &8_i32.to_ne_bytes()).unwrap();
        assert_eq!(get_int(&options, libc::SOL_SOCKET, libc::SO_RCVBUF), 8 * SLOT_BYTES as c_int);
        assert_eq!(options.set(libc::SOL_SOCKET, libc::SO_SNDBUF, &(-1_i32).to_ne_bytes()), Err(libc::EINVAL));
        assert_eq!(options.set(libc::SOL_SOCKET, libc::SO_SNDBUF, &[1, 2]), Err(libc::EINVAL));
    }

    #[test]
    fn unknown_options_are_enoprotoopt_and_linger_round_trips() {
        let mut options = Options::default();
        assert_eq!(options.set(libc::SOL_IP, libc::IP_TOS, &0_i32.to_ne_bytes()), Err(libc::ENOPROTOOPT));
        assert!(matches!(options.get(libc::IPPROTO_TCP, libc::TCP_INFO), Err(libc::ENOPROTOOPT)));
        let mut linger = [0u8; 8];
        linger[..4].copy_from_slice(&1_i32.to_ne_bytes());
        linger[4..].copy_from_slice(&5_i32.to_ne_bytes());
        options.set(libc::SOL_SOCKET, libc::SO_LINGER, &linger).unwrap();
        assert!(
            matches!(options.get(libc::SOL_SOCKET, libc::SO_LINGER), Ok(Value::Linger(l)) if l.l_onoff == 1 && l.l_linger == 5)
        );
    }
}
