//! Contexts opened and closed from many threads with no context kept
//! open: the engine on the address stops with its last context and starts
//! again with the next, and no open may meet the port still held by an
//! engine that is stopping. (Its own process: the device's address is
//! read once per process.)

use softrnic_ibverbs::{context, device, memory};

#[test]
fn the_last_context_stops_the_engine_and_the_next_starts_it_again() {
    // SAFETY: set before any device lookup; no other thread reads the
    // environment yet.
    unsafe { std::env::set_var("SOFTRNIC_ADDR", "127.0.5.7") };
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..25 {
                    // SAFETY: the verbs' own sequence; each context is
                    // closed by the thread that opened it.
                    unsafe {
                        let mut n = 0;
                        let list = device::ibv_get_device_list(&mut n);
                        let ctx = context::ibv_open_device(*list);
                        device::ibv_free_device_list(list);
                        let errno = std::io::Error::last_os_error();
                        assert!(!ctx.is_null(), "open failed: {errno}");
                        let pd = memory::ibv_alloc_pd(ctx);
                        assert!(!pd.is_null());
                        assert_eq!(memory::ibv_dealloc_pd(pd), 0);
                        assert_eq!(context::ibv_close_device(ctx), 0);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every engine stopped with its last context: the port is free.
    assert!(std::net::UdpSocket::bind(("127.0.5.7", 4791)).is_ok(), "RoCEv2's port is free again");
}
