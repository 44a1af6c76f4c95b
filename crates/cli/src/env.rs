//! `softrnic env`: the variables that put unmodified RDMA programs on
//! softrnic, as shell lines to `eval`: the drop-in libraries first on
//! `LD_LIBRARY_PATH`, and the device's address when one is given.
//!
//!     eval "$(softrnic env --addr 127.0.0.2)"
//!     ibv_devinfo

use std::net::IpAddr;

use clap::Args;

#[derive(Args, Debug)]
pub struct EnvArgs {
    /// The device's address, exported as SOFTRNIC_ADDR (default: SOFTRNIC_ADDR as it is).
    #[arg(long)]
    pub addr: Option<IpAddr>,
}

pub fn run(args: &EnvArgs) -> Result<(), String> {
    let lib = crate::libraries::dir().ok_or(crate::libraries::MISSING)?;
    let path = crate::libraries::search_path(&lib, std::env::var_os("LD_LIBRARY_PATH"));
    println!("export LD_LIBRARY_PATH={}", quoted(&path.to_string_lossy()));
    if let Some(addr) = args.addr.map_or_else(crate::addr::from_env, |a| Ok(Some(a)))? {
        println!("export SOFTRNIC_ADDR={addr}");
    }
    Ok(())
}

/// `text` in single quotes for a POSIX shell.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(quoted("/opt/soft rnic/lib"), "'/opt/soft rnic/lib'");
        assert_eq!(quoted("it's"), r"'it'\''s'");
    }
}
