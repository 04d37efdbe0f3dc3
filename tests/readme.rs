//! The README's quick start is the program `examples/quickstart.rs` runs
//! (the examples layer runs it; `cargo test` builds it): the README's
//! ```rust block must equal that file without its `//!` header, so the code a
//! newcomer copies is code CI compiles and runs.

#[test]
fn readme_quick_start_is_examples_quickstart() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example = std::fs::read_to_string(format!("{root}/examples/quickstart.rs"))
        .expect("examples/quickstart.rs");
    let start = readme
        .find("```rust\n")
        .expect("README.md has a ```rust block (the quick start)")
        + "```rust\n".len();
    let len = readme[start..]
        .find("```")
        .expect("the README's ```rust block is closed");
    let shown = &readme[start..start + len];
    let program: String = example
        .lines()
        .skip_while(|l| l.starts_with("//!") || l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        shown, program,
        "README.md's quick start differs from examples/quickstart.rs (without its //! header)"
    );
}
