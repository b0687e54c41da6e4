//! Generated CSI v1 types and gRPC services (spec v1.12.0, `src/csi/proto/csi.proto`).
#![allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]

tonic::include_proto!("csi.v1");
