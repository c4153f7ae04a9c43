//! # ringcast-transport-rocev2-udp
//!
//! The default ringcast transport: every data datagram's UDP payload is a wire-exact RoCEv2 UD
//! `SEND_ONLY_WITH_IMMEDIATE` packet sent to one IPv4 multicast group per lane; the control path
//! and the fetch reads run over TCP between ranks.
