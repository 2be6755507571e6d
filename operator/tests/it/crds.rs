//! The checked-in CRDs are exactly what the Rust types generate.

#[test]
fn checked_in_crds_are_fresh() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    for (name, doc) in bindery_operator::crd::crd_documents() {
        let on_disk = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(
            on_disk == doc,
            "crds/{name} is stale: run `cargo run -p bindery-operator -- crdgen`"
        );
    }
}
