//! Checks Rust's copies of C structures against the real headers: a C
//! program compiled with the header prints every size and field offset,
//! and each must equal Rust's. The layout tests of this crate (verbs.h)
//! and of softrnic's librdmacm (rdma_cma.h) use it.

use std::process::Command;

/// `(C expression, Rust value)` pairs for the sizes of `struct NAME`s and
/// the offsets of the listed fields (`a.b` reaches into a member).
#[macro_export]
macro_rules! c_layout {
    ($( $ty:ident { $($field:ident $(. $sub:ident)*),* } )*) => {{
        let mut v: Vec<(String, usize)> = Vec::new();
        $(
            v.push((format!("sizeof(struct {})", stringify!($ty)), std::mem::size_of::<$ty>()));
            $( v.push((
                format!("offsetof(struct {}, {})", stringify!($ty), stringify!($field $(. $sub)*).replace(' ', "")),
                std::mem::offset_of!($ty, $field $(. $sub)*),
            )); )*
        )*
        v
    }};
}

/// Compiles the checks against `header` (an include path like
/// `infiniband/verbs.h`) and returns every mismatch. A missing header or C
/// compiler is an error under CI (`CI=true`) and a skip, said on stderr,
/// elsewhere (`Ok(false)`).
pub fn compare_with_header(header: &str, package: &str, checks: &[(String, usize)]) -> Result<bool, String> {
    let path = format!("/usr/include/{header}");
    if !std::path::Path::new(&path).exists() {
        let why = format!("{path} is missing (apt-get install {package})");
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            return Err(why);
        }
        eprintln!("skipped: {why}");
        return Ok(false);
    }
    let mut source = format!("#include <stdio.h>\n#include <stddef.h>\n#include <{header}>\nint main(void) {{\n");
    for (expr, _) in checks {
        source += &format!("    printf(\"%zu\\n\", (size_t)({expr}));\n");
    }
    source += "    return 0;\n}\n";
    let dir = std::env::temp_dir().join(format!("softrnic-layout-{}-{}", std::process::id(), package));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("layout.c"), source).map_err(|e| e.to_string())?;
    let compiled = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .current_dir(&dir)
        .args(["-o", "layout", "layout.c"])
        .output()
        .map_err(|e| format!("no C compiler (cc): {e}"))?;
    if !compiled.status.success() {
        return Err(String::from_utf8_lossy(&compiled.stderr).into_owned());
    }
    let run = Command::new(dir.join("layout")).output().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let c_values: Vec<usize> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| l.parse().map_err(|_| format!("bad line {l:?}")))
        .collect::<Result<_, _>>()?;
    if c_values.len() != checks.len() {
        return Err(format!("{} values for {} checks", c_values.len(), checks.len()));
    }
    let mismatches: Vec<String> = checks
        .iter()
        .zip(&c_values)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((expr, rust), c)| format!("{expr}: C {c}, Rust {rust}"))
        .collect();
    match mismatches.is_empty() {
        true => Ok(true),
        false => Err(format!("layouts differ from {header}:\n{}", mismatches.join("\n"))),
    }
}
