//! `python -m ocular run`'s arguments before clap sees them (plain Rust, so `cargo test` covers it
//! without an interpreter).

use std::ffi::OsString;

/// `-mMODULE` as `-m MODULE`, as python accepts it (clap would end the option at an attached value, and
/// take what follows for Ocular's options instead of the module's). Only `run`'s own options are looked
/// at: the scan stops at the first argument that is not one (the script), and skips options' values.
pub fn split_attached_module(argv: Vec<OsString>) -> Vec<OsString> {
    const TAKES_VALUE: [&str; 6] = ["-o", "--output", "--mode", "--threshold", "--include", "--exclude"];
    let mut out = Vec::with_capacity(argv.len() + 1);
    let mut it = argv.into_iter();
    out.extend(it.next()); // the command
    while let Some(a) = it.next() {
        let s = a.to_str().unwrap_or("");
        if TAKES_VALUE.contains(&s) {
            out.push(a);
            out.extend(it.next());
        } else if let Some(module) = s.strip_prefix("-m").filter(|m| !m.is_empty() && !s.starts_with("--")) {
            out.push("-m".into());
            out.push(module.into());
            break;
        } else if s.starts_with('-') && s != "-" && s != "--" {
            out.push(a);
        } else {
            out.push(a);
            break;
        }
    }
    out.extend(it);
    out
}

#[cfg(test)]
mod tests {
    use super::split_attached_module;

    fn split(args: &[&str]) -> Vec<String> {
        let v = split_attached_module(args.iter().map(|a| a.into()).collect());
        v.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn an_attached_module_is_split_and_nothing_else_is() {
        assert_eq!(split(&["run", "-mhttp.server", "8000", "-q"]), ["run", "-m", "http.server", "8000", "-q"]);
        assert_eq!(split(&["run", "-q", "-o", "-mx", "-mjson.tool"]), ["run", "-q", "-o", "-mx", "-m", "json.tool"]);
        assert_eq!(split(&["run", "script.py", "-mfoo"]), ["run", "script.py", "-mfoo"]);
        assert_eq!(
            split(&["run", "--mode", "calls", "-m", "mod", "-mx"]),
            ["run", "--mode", "calls", "-m", "mod", "-mx"]
        );
        assert_eq!(split(&["run", "--", "-mfoo"]), ["run", "--", "-mfoo"]);
    }
}
