//! Gives the shared library NCCL's SONAME, so programs linked with -lnccl (through the
//! libnccl.so -> libnccl.so.2 -> libferroccl.so links) load it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
