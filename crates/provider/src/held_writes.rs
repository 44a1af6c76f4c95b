//! Pages replaced under running threads without losing their writes.
//!
//! [`crate::remap`] copies a program's pages into a memfd and maps the
//! memfd over them. A write another thread makes between the copy and the
//! mapping lands in the old pages and is gone: a buffer's first and last
//! pages hold its neighbours too (other heap objects, malloc's own
//! headers), and those are written by whoever owns them. The rdma_cm agent
//! thread lost the release of its state's mutex that way, and the next
//! lock waited forever (ucmatose through softrnicd hung about once in 100 runs).
//!
//! [`hold_writes`] makes the pages read-only for the copy: a thread that
//! writes one faults, and its `SIGSEGV` handler (installed for the
//! duration) waits until the memfd is mapped, then returns, and the write
//! runs again on the new pages. Reads go on throughout. A fault anywhere
//! else goes to the handler the program had. What cannot wait is a system
//! call writing into the pages (a `read(2)` into a neighbour on the same
//! page): it fails with `EFAULT` for those microseconds.

use std::cell::UnsafeCell;
use std::io;
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The last window's range, `[START, END)`, kept after it closes: a
/// thread that faulted in it before the close may reach the handler after,
/// and must only write again, not be taken for a crash. `OPEN` while
/// writers wait; `WINDOW` counts the windows, so a waiter tells this one
/// from the next.
static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
static OPEN: AtomicBool = AtomicBool::new(false);
static WINDOW: AtomicU64 = AtomicU64::new(0);
/// One window at a time.
static WINDOWS: Mutex<()> = Mutex::new(());

/// The program's `SIGSEGV` action, kept while ours is installed.
struct Previous(UnsafeCell<MaybeUninit<libc::sigaction>>);
// SAFETY: written only while our handler is not installed (windows are
// serialized by `WINDOWS`), read only by the handler while it is.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(UnsafeCell::new(MaybeUninit::zeroed()));

/// Runs `replace` with the whole pages `[start, start + len)` read-only to
/// every thread, and any thread that writes them waiting for it to end.
/// `replace` must leave the range mapped read-write (a `MAP_FIXED`
/// mapping over it); if it fails, the pages are made writable again.
///
/// # Safety
/// The range is this process's private memory; `replace` writes none of
/// it (it may read it through the kernel), allocates nothing (a waiting
/// thread may hold malloc's lock) and takes no lock another thread may
/// hold while it writes.
pub unsafe fn hold_writes<T>(start: usize, len: usize, replace: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let _one = WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    // This thread's signals wait too: a handler writing the pages would
    // wait for this thread, and a fault of its own kills it as any would.
    let blocked = block_signals();
    START.store(start, Ordering::Relaxed);
    END.store(start + len, Ordering::Relaxed);
    WINDOW.fetch_add(1, Ordering::AcqRel);
    OPEN.store(true, Ordering::Release);
    // SAFETY: the handler and its flags are valid; `PREVIOUS` is not read
    // before ours is installed (see its impl).
    if let Err(e) = unsafe { install() } {
        OPEN.store(false, Ordering::Release);
        unblock_signals(blocked);
        return Err(e);
    }
    // SAFETY: the caller's range; read-only until `replace` maps over it.
    let result = match unsafe { rustix::mm::mprotect(start as *mut _, len, rustix::mm::MprotectFlags::READ) } {
        Ok(()) => replace().inspect_err(|_| {
            // SAFETY: as above; the old pages, writable again.
            let _ = unsafe {
                rustix::mm::mprotect(
                    start as *mut _,
                    len,
                    rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE,
                )
            };
        }),
        Err(e) => Err(e.into()),
    };
    OPEN.store(false, Ordering::Release);
    // SAFETY: the action saved by `install`.
    unsafe { restore() };
    unblock_signals(blocked);
    result
}

/// Installs [`on_fault`], saving the program's action in `PREVIOUS`.
unsafe fn install() -> io::Result<()> {
    // SAFETY: a C structure of integers and pointers; zero is valid.
    let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
    ours.sa_sigaction = on_fault as *const () as libc::sighandler_t;
    ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: a valid action; `PREVIOUS` is ours to write (no handler of
    // ours reads it now).
    match unsafe { libc::sigaction(libc::SIGSEGV, &ours, (*PREVIOUS.0.get()).as_mut_ptr()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Puts the program's action back.
unsafe fn restore() {
    // SAFETY: `install` filled `PREVIOUS`.
    unsafe { libc::sigaction(libc::SIGSEGV, (*PREVIOUS.0.get()).as_ptr(), std::ptr::null_mut()) };
}

/// The `SIGSEGV` handler while a window is open. Async-signal-safe: atomics
/// and system calls only.
extern "C" fn on_fault(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let window = WINDOW.load(Ordering::Acquire);
    if (START.load(Ordering::Acquire)..END.load(Ordering::Acquire)).contains(&addr) {
        // A write to the pages being replaced: wait, then return, and the
        // write runs again on whatever is mapped there now.
        while OPEN.load(Ordering::Acquire) && WINDOW.load(Ordering::Acquire) == window {
            // SAFETY: a system call, async-signal-safe.
            unsafe { libc::sched_yield() };
        }
        return;
    }
    // Not ours: as the program's handler would have it.
    // SAFETY: `PREVIOUS` holds the program's action while ours is installed.
    let previous = unsafe { (*PREVIOUS.0.get()).assume_init_ref() };
    match previous.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => {
            // The default action, taken when the fault recurs on return.
            // SAFETY: a zeroed action is SIG_DFL.
            let default: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a valid action.
            unsafe { libc::sigaction(signal, &default, std::ptr::null_mut()) };
        }
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the program installed this function with SA_SIGINFO.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            handler(signal, info, context);
        }
        handler => {
            // SAFETY: the program installed this function as a plain handler.
            let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            handler(signal);
        }
    }
}

/// Blocks every signal on this thread; returns the mask to put back.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; the calls fill it.
    unsafe {
        let (mut all, mut before) = (MaybeUninit::<libc::sigset_t>::zeroed(), MaybeUninit::<libc::sigset_t>::zeroed());
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_BLOCK, all.as_ptr(), before.as_mut_ptr());
        before.assume_init()
    }
}

fn unblock_signals(before: libc::sigset_t) {
    // SAFETY: a mask `block_signals` read.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// A thread that keeps counting in a page while the page is replaced
    /// (by a copy of itself, as the remap does) loses no count.
    #[test]
    fn a_write_during_the_replacement_lands_on_the_new_page() {
        let page = rustix::param::page_size();
        for _ in 0..50 {
            let base = fresh_page();
            // SAFETY: the page is mapped, aligned, and stays mapped (it is
            // never unmapped in this test).
            let counter: &'static AtomicU64 = unsafe { &*(base as *const AtomicU64) };
            let (stop, started) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
            let writer = std::thread::spawn({
                let (stop, started) = (stop.clone(), started.clone());
                move || {
                    let mut mine = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        counter.fetch_add(1, Ordering::Relaxed);
                        mine += 1;
                        started.store(true, Ordering::Relaxed);
                    }
                    mine
                }
            });
            while !started.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            let fd = rustix::fs::memfd_create("held-writes-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
            rustix::fs::ftruncate(&fd, page as u64).unwrap();
            // SAFETY: one window; our page; `replace` reads it through the
            // kernel, allocates nothing and maps over it.
            unsafe {
                hold_writes(base, page, || {
                    // Long enough for the writer to try many times.
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    let wrote = libc::pwrite(fd_raw(&fd), base as *const libc::c_void, page, 0);
                    assert_eq!(wrote, page as isize);
                    rustix::mm::mmap(
                        base as *mut libc::c_void,
                        page,
                        rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                        rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::FIXED,
                        &fd,
                        0,
                    )?;
                    Ok(())
                })
            }
            .unwrap();
            std::thread::sleep(std::time::Duration::from_micros(200));
            stop.store(true, Ordering::Relaxed);
            let mine = writer.join().unwrap();
            assert_eq!(counter.load(Ordering::Relaxed), mine, "every count the writer made is in the page");
        }
    }

    /// Outside the window the program's own handling of a fault stands:
    /// our handler is there only while a window is open.
    #[test]
    fn the_programs_action_is_back_after_the_window() {
        let page = rustix::param::page_size();
        let before = programs_action();
        let base = fresh_page();
        // SAFETY: our page; `replace` fails, and the page is writable again.
        let failed =
            unsafe { hold_writes(base, page, || -> io::Result<()> { Err(io::Error::other("refused on purpose")) }) };
        assert!(failed.is_err());
        // SAFETY: our page, writable again.
        unsafe { (base as *mut u8).write_volatile(7) };
        assert_eq!(before, programs_action());
    }

    /// The `SIGSEGV` action between windows. Read under `WINDOWS`: the
    /// other tests here open windows on their own threads, and one open
    /// while this reads would show our handler (CI saw that once).
    fn programs_action() -> libc::sighandler_t {
        let _between_windows = WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: reads the current action only.
        unsafe {
            let mut a = MaybeUninit::<libc::sigaction>::zeroed();
            libc::sigaction(libc::SIGSEGV, std::ptr::null(), a.as_mut_ptr());
            a.assume_init().sa_sigaction
        }
    }

    /// A private anonymous page of the test's own, never unmapped.
    fn fresh_page() -> usize {
        // SAFETY: a new mapping, overlapping nothing.
        let page = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                rustix::param::page_size(),
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        };
        page.unwrap() as usize
    }

    fn fd_raw(fd: &std::os::fd::OwnedFd) -> libc::c_int {
        std::os::fd::AsRawFd::as_raw_fd(fd)
    }
}
