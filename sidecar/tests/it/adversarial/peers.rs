//! Anything on the pod network: a sniffer between two replicas that
//! replays what it saw.
