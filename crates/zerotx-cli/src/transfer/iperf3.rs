//! iperf3's control protocol, recognised at either end so a user who mixes the tools is told
//! which is which: an iperf3 client opens its control connection with a 37-byte cookie (36
//! characters of base32 and a NUL), and an iperf3 server answers a new connection with a state
//! byte (`PARAM_EXCHANGE`, 9, then an error state when what follows is no iperf3 request). zerotx
//! sends and receives plain bytes, and never writes back on a stream, so neither can be ours.

/// An iperf3 client's cookie: 36 characters of iperf3's base32 alphabet, then a NUL.
const COOKIE_LEN: usize = 37;

/// iperf3's state after reading a cookie: the server asks for the test's parameters.
const PARAM_EXCHANGE: u8 = 9;
/// iperf3's `SERVER_ERROR` and `ACCESS_DENIED` states, as signed bytes (-2, -1).
const SERVER_ERROR: u8 = 0xfe;
/// See [`SERVER_ERROR`].
const ACCESS_DENIED: u8 = 0xff;

/// What `zerotx recv` says when an iperf3 client connects.
pub const CLIENT: &str = "this is iperf3's control protocol (an iperf3 client connected); \
                          zerotx speaks plain bytes: run `zerotx send` against this receiver, or \
                          `iperf3 -s` for iperf3 clients";

/// What `zerotx send` says when its receiver is an iperf3 server.
pub const SERVER: &str = "this is iperf3's control protocol (the receiver is `iperf3 -s`); zerotx \
                          speaks plain bytes: run `zerotx recv` there, or `iperf3 -c` against \
                          iperf3";

/// Whether `first` (the first bytes a connection sent) is an iperf3 client's cookie.
pub fn is_client_cookie(first: &[u8]) -> bool {
    first.len() == COOKIE_LEN
        && first[COOKIE_LEN - 1] == 0
        && first[..COOKIE_LEN - 1]
            .iter()
            .all(|b| matches!(b, b'a'..=b'z' | b'2'..=b'7'))
}

/// Whether `first` (the first byte a receiver wrote back on a stream) is an iperf3 server's
/// state.
pub fn is_server_state(first: u8) -> bool {
    matches!(first, PARAM_EXCHANGE | SERVER_ERROR | ACCESS_DENIED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_is_36_base32_characters_and_a_nul() {
        assert!(is_client_cookie(b"2munscelxd5fa2c4vpteaaezezqo2t7vo7oj\0"));
        assert!(!is_client_cookie(b"2munscelxd5fa2c4vpteaaezezqo2t7vo7oj"));
        assert!(!is_client_cookie(b"2munscelxd5fa2c4vpteaaezezqo2t7vo7o1\0"));
        assert!(!is_client_cookie(&[0u8; 37]));
        assert!(is_server_state(9) && is_server_state(0xfe) && !is_server_state(b'x'));
    }
}
