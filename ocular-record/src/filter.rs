//! Include/exclude filters, decided once per code object.

/// Substring filters on a code object's file name or qualified name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// When non-empty, only code objects matching one of these are recorded.
    pub include_only: Vec<String>,
    /// Code objects matching one of these are not recorded.
    pub exclude: Vec<String>,
}

impl Filter {
    /// Whether a code object with this file name and qualified name is recorded. Exclusion wins over
    /// inclusion, so `include_only=["myapp"], exclude=["myapp/vendor"]` does what it says.
    pub fn records(&self, filename: &str, qualname: &str) -> bool {
        let hit = |p: &String| filename.contains(p.as_str()) || qualname.contains(p.as_str());
        if self.exclude.iter().any(hit) {
            return false;
        }
        self.include_only.is_empty() || self.include_only.iter().any(hit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusion_wins_and_empty_include_means_everything() {
        let f = Filter { include_only: vec!["myapp".into()], exclude: vec!["myapp/vendor".into()] };
        assert!(f.records("/src/myapp/core.py", "run"));
        assert!(!f.records("/src/myapp/vendor/six.py", "run"));
        assert!(!f.records("/usr/lib/python3.12/threading.py", "Thread.run"));
        assert!(f.records("<string>", "myapp_main"), "qualname matches too");
        let all = Filter::default();
        assert!(all.records("anything.py", "f"));
        let ex = Filter { include_only: vec![], exclude: vec!["threading".into()] };
        assert!(!ex.records("/usr/lib/python3.12/threading.py", "Thread._bootstrap"));
        assert!(ex.records("work.py", "main"));
    }
}
