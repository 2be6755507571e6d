//! Hostile remote APIs: redirects to another origin and echoes of what they
//! were sent; no credential crosses an origin.
