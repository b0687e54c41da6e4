//! Generated CSI v1 types and gRPC services (spec v1.12.0, `proto/csi.proto`), in a
//! crate of their own so the generated code is compiled once and the rest of Tessera
//! does not rebuild it. The CSI services themselves are in `tessera::csi`.
#![allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]

tonic::include_proto!("csi.v1");
