//! The table of StorageClass parameters in docs/csi.md is the rendering of the
//! driver's own list (`tessera_csi::controller::parameters::PARAMETERS`), so the docs
//! cannot name a parameter the driver refuses or miss one it takes.
//! `TESSERA_BLESS=1` writes the table again.

use tessera_csi::controller::parameters;

use crate::support;

const BEGIN: &str = "<!-- parameters:begin -->\n";
const END: &str = "<!-- parameters:end -->";

#[test]
fn the_parameter_table_in_the_docs_is_the_drivers_list() {
    let path = support::repo_root().join("docs/csi.md");
    let docs = std::fs::read_to_string(&path).unwrap();
    let start = docs.find(BEGIN).expect("docs/csi.md marks the table") + BEGIN.len();
    let end = start + docs[start..].find(END).expect("the table's end marker");
    let want = parameters::table();
    if std::env::var_os("TESSERA_BLESS").is_some() {
        let blessed = format!("{}{want}{}", &docs[..start], &docs[end..]);
        std::fs::write(&path, blessed).unwrap();
        return;
    }
    assert_eq!(
        &docs[start..end],
        want,
        "docs/csi.md's parameter table is stale: TESSERA_BLESS=1 cargo test --test manifests parameters::"
    );
    for p in parameters::PARAMETERS {
        assert!(docs[start..end].contains(&format!("`{}`", p.name)));
    }
}
