//! rdma_bench's answers to what it cannot do: one line that names the
//! problem and the fix, exit status 2, never a panic. (Runs over the
//! drop-in library are in scripts/verbs-matrix.py.)

use std::process::Command;

fn rdma_bench(args: &[&str], library_path: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rdma_bench"))
        .args(args)
        .env("LD_LIBRARY_PATH", library_path)
        .output()
        .expect("run rdma_bench");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn without_a_device_it_says_where_to_find_one() {
    // No softrnic library on the path: the system's libibverbs with no
    // RDMA device, or no libibverbs at all.
    let empty = std::env::temp_dir();
    let (code, err) = rdma_bench(&["-serverIp", "127.0.0.1", "-nodeId", "1", "-port", "1"], empty.to_str().unwrap());
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // No kernel RDMA support (ibv_get_device_list fails), none of its
    // devices, or no libibverbs: each names softrnic's library.
    let said = err.contains("run over softrnic's libibverbs.so.1 (LD_LIBRARY_PATH=target/softrnic/lib)")
        || err.contains("cannot load libibverbs.so.1") && err.contains("LD_LIBRARY_PATH");
    assert!(said && err.lines().count() == 1, "{err}");
}

#[test]
fn bad_flags_say_what_is_wrong() {
    let (code, err) = rdma_bench(&["-serverIp", "127.0.0.1", "-nodeId", "5"], "");
    assert_eq!(code, 2);
    assert!(err.contains("-nodeId") && err.contains("5"), "{err}");
    let (code, err) = rdma_bench(&["-nodeId", "0"], "");
    assert_eq!(code, 2);
    assert!(err.contains("--serverIp"), "{err}");
}
