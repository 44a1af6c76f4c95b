//! `softrnic env`: the variables that put unmodified RDMA programs on
//! softrnic, as shell lines to `eval`: the drop-in libraries first on
//! `LD_LIBRARY_PATH`, the softrnicd to start on demand, and the device's
//! address when one is given.
//!
//!     eval "$(softrnic env --addr 127.0.0.2)"
//!     ibv_devinfo

use std::net::IpAddr;

use clap::{Args, ValueEnum};

#[derive(Args, Debug)]
pub struct EnvArgs {
    /// The device's address, exported as SOFTRNIC_ADDR (default: SOFTRNIC_ADDR as it is).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// How to print each variable.
    #[arg(long, value_enum, default_value_t = Format::Sh)]
    pub format: Format,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Format {
    /// `export NAME='value'`, for a POSIX shell's eval.
    Sh,
    /// `NAME=value`, as $GITHUB_ENV, `docker run --env-file` and systemd's
    /// EnvironmentFile read them.
    Plain,
}

pub fn run(args: &EnvArgs) -> Result<(), String> {
    let mut vars: Vec<(&str, String)> =
        crate::layout::program_env()?.into_iter().map(|(k, v)| (k, v.to_string_lossy().into_owned())).collect();
    if let Some(addr) = args.addr.map_or_else(crate::addr::from_env, |a| Ok(Some(a)))? {
        vars.push(("SOFTRNIC_ADDR", addr.to_string()));
    }
    for (key, value) in vars {
        match args.format {
            Format::Sh => println!("export {key}={}", quoted(&value)),
            Format::Plain => println!("{key}={value}"),
        }
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
