//! What the lab's tests share.

/// Whether the lab can run here (root, iproute2, ethtool); under CI it
/// must, so a missing piece fails the test instead of skipping it.
pub fn lab_available() -> bool {
    match softrnic_lab::namespaces::unavailable() {
        None => true,
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI must run the lab: {reason}"),
        Some(reason) => {
            eprintln!("skipped: {reason}");
            false
        }
    }
}
