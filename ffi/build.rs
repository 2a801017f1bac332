//! Gives the shared library a versioned soname (`libkvfence.so.0`: the major version of
//! the C ABI), so that programs linked against it load the ABI they were built for.
fn main() {
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" || target_os == "android" || target_os.ends_with("bsd") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvfence.so.0");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
