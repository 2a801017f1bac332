//! Exposes PyO3's interpreter cfgs (`Py_GIL_DISABLED` and friends) to the binding, which
//! compiles its borrowed-reference fast paths only for interpreters with a GIL.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
