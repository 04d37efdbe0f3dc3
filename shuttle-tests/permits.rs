#![cfg(feature = "shuttle")]
