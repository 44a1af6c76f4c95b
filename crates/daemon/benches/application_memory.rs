//! How softrnicd reaches memory a program allocated itself (issue 11's
//! "choose and measure"): the remap it does (FreeFlow's; `remap.rs`)
//! against cross-memory attach (`process_vm_readv`), the design it did not
//! build. ARCHITECTURE.md states the trade-offs; BENCHMARKS.md the figures.
//!
//! - `register`: what making a buffer reachable costs. A remap copies the
//!   buffer's whole pages into a memfd and maps it over them, so an
//!   unaligned buffer pays for the pages it touches; cross-memory attach
//!   costs nothing here.
//! - `access`: what the engine then pays for each packet's payload. With a
//!   remap it is a copy from a mapping; with cross-memory attach a system
//!   call per access (read here from this process, which the kernel treats
//!   as any other: the same page walk and copy, without the permission
//!   check a container would need).
//!
//! `cargo bench -p softrnic-daemon --bench application_memory`

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rustix::mm::{MapFlags, ProtFlags};
use softrnic_provider::remap;

/// A program's buffer as malloc gives a large one: its own mapping, its
/// pages touched, unmapped when dropped.
struct Buffer {
    at: *mut u8,
    len: usize,
}

impl Buffer {
    fn new(len: usize) -> Buffer {
        // SAFETY: a fresh private mapping of our own.
        let at = unsafe {
            rustix::mm::mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE)
        }
        .expect("mmap")
        .cast::<u8>();
        // SAFETY: the mapping just made, `len` bytes.
        unsafe { std::ptr::write_bytes(at, 0x5a, len) };
        Buffer { at, len }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made; nothing uses it any more.
        let _ = unsafe { rustix::mm::munmap(self.at.cast(), self.len) };
    }
}

fn register(c: &mut Criterion) {
    let page = rustix::param::page_size();
    let mut group = c.benchmark_group("register");
    // (bytes, offset into the first page): aligned, and one that spills
    // onto a page more.
    for (len, offset) in [(4096usize, 0usize), (4096, 100), (65536, 0), (65536, 100), (1 << 20, 0), (16 << 20, 0)] {
        group.throughput(Throughput::Bytes(len as u64));
        let name = if offset == 0 { "remap, aligned" } else { "remap, unaligned" };
        group.bench_with_input(BenchmarkId::new(name, len), &(len, offset), |b, &(len, offset)| {
            b.iter_batched(
                || Buffer::new((len + offset).next_multiple_of(page)),
                |buffer| {
                    // SAFETY: our own buffer, which no other thread writes.
                    let shared = unsafe { remap::share(buffer.at.add(offset), len) }.expect("remap");
                    (shared, buffer)
                },
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

fn access(c: &mut Criterion) {
    let mut group = c.benchmark_group("access");
    let program = Buffer::new(1 << 20);
    // SAFETY: our own buffer, which no other thread writes.
    let shared = unsafe { remap::share(program.at, program.len) }.expect("remap");
    drop(shared); // the pages stay remapped; the engine's view is the same memory
    let pid = std::process::id() as libc::pid_t;
    let mut packet = vec![0u8; 65536];
    for len in [64usize, 1024, 4096, 65536] {
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_with_input(BenchmarkId::new("remap (a copy from the mapping)", len), &len, |b, &len| {
            b.iter(|| {
                // SAFETY: `len` bytes of the program's buffer, remapped and
                // mapped for as long as this runs.
                let from = unsafe { std::slice::from_raw_parts(program.at, len) };
                packet[..len].copy_from_slice(black_box(from));
                black_box(&packet);
            });
        });
        group.bench_with_input(BenchmarkId::new("cross-memory attach (process_vm_readv)", len), &len, |b, &len| {
            b.iter(|| {
                let local = libc::iovec { iov_base: packet.as_mut_ptr().cast(), iov_len: len };
                let remote = libc::iovec { iov_base: black_box(program.at).cast(), iov_len: len };
                // SAFETY: both iovecs describe memory of this process that
                // is mapped for as long as this runs; the kernel checks
                // the remote one and fails with EFAULT rather than fault.
                let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
                assert_eq!(read, len as isize, "process_vm_readv: {}", std::io::Error::last_os_error());
                black_box(&packet);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, register, access);
criterion_main!(benches);
