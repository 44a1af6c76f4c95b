//! Manual pages and shell completions, from the programs' own flags (so
//! they cannot drift from them): `softrnic completions SHELL` prints
//! softrnic's completion script, and `softrnic manuals DIR` (hidden; the
//! package's build runs it) writes every page and script the package
//! installs, for softrnic, softrnicd and rdma_bench.

use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: Shell,
}

#[derive(Args, Debug)]
pub struct ManualsArgs {
    /// Where to write man1/*.1 and completions/{bash,zsh,fish}/.
    pub out: PathBuf,
}

/// The shells the package installs completions for, and where each
/// looks for them under /usr/share.
const PACKAGED_SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

pub fn completions(args: &CompletionsArgs) -> Result<(), String> {
    let mut command = crate::Cli::command();
    clap_complete::generate(args.shell, &mut command, "softrnic", &mut std::io::stdout());
    Ok(())
}

pub fn manuals(args: &ManualsArgs) -> Result<(), String> {
    let programs = [
        crate::Cli::command(),
        softrnic_daemon::command_line::Args::command(),
        softrnic_rdma_bench::args::Args::command(),
    ];
    let man = args.out.join("man1");
    create(&man)?;
    for program in &programs {
        // One page per program and per subcommand (softrnic-bench.1 ...).
        clap_mangen::generate_to(program.clone(), &man).map_err(|e| write_error(&man, e))?;
        for shell in PACKAGED_SHELLS {
            let dir = args.out.join("completions").join(shell.to_string());
            create(&dir)?;
            let name = program.get_name().to_string();
            clap_complete::generate_to(shell, &mut program.clone(), name, &dir).map_err(|e| write_error(&dir, e))?;
        }
    }
    Ok(())
}

fn create(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| write_error(dir, e))
}

fn write_error(dir: &Path, e: std::io::Error) -> String {
    format!("cannot write into {}: {e}", dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_gets_its_page_and_its_completions() {
        let out = std::env::temp_dir().join(format!("softrnic-manuals-{}", std::process::id()));
        manuals(&ManualsArgs { out: out.clone() }).unwrap();
        let page = std::fs::read_to_string(out.join("man1/softrnic-bench.1")).unwrap();
        assert!(page.contains(".TH softrnic-bench 1"), "{page}");
        let daemon = std::fs::read_to_string(out.join("man1/softrnicd.1")).unwrap();
        assert!(daemon.contains("embedded\\-switch"), "{daemon}");
        assert!(out.join("man1/rdma_bench.1").exists());
        // Hidden commands get no page.
        assert!(!out.join("man1/softrnic-manuals.1").exists());
        let bash = std::fs::read_to_string(out.join("completions/bash/softrnic.bash")).unwrap();
        assert!(bash.contains("doctor") && bash.contains("complete -F"), "{bash}");
        assert!(out.join("completions/zsh/_softrnicd").exists());
        assert!(out.join("completions/fish/rdma_bench.fish").exists());
        std::fs::remove_dir_all(&out).unwrap();
    }
}
