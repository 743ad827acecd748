// Where one HTTP/1.1 request ends in the bytes a connection has sent so far, and whether
// the server will take it: the request line, the headers, and Content-Length bound by the
// body limit. The server reads a request whole with this before any worker sees it, so a
// client that sends slowly (or never finishes) holds a buffer, not a thread. No LibTorch,
// no sockets (fuzzed by fuzz/fuzz_server_request.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kvevict::server {

struct FramingLimits {
  int64_t max_body_bytes = 1 << 20;
  int64_t max_head_bytes = 64 << 10;  // request line and headers together
};

struct Framing {
  enum class State {
    NeedMore,  // the request is not whole yet
    Complete,  // bytes [skipped, skipped + request_bytes) are one whole request
    Refused,   // answer `status` with `message` and close the connection
  };
  State state = State::NeedMore;
  size_t skipped = 0;        // empty lines before the request line (RFC 9112 2.2 lets a server ignore them)
  size_t request_bytes = 0;  // Complete: head and body
  size_t head_bytes = 0;     // the head once it is whole, else 0
  int64_t content_length = 0;
  bool expects_continue = false;  // "Expect: 100-continue" and the body has not all come
  std::string method, target;     // once the request line is whole (for the log)
  int status = 0;                 // Refused: a 4xx
  std::string message;            // Refused: one line naming the header or the limit
};

// A header's (or request line's) text as an error line quotes it: in double quotes,
// printable ASCII ('?' for any other byte), at most `most` characters, then "...".
std::string quoted_header_text(std::string_view text, size_t most = 40);

// Reads the start of `bytes` (everything a connection has sent and the server has not yet
// answered). Refuses: a malformed request line or header (400), a head over the limit
// (431), a Content-Length that is not a decimal count of bytes or is given twice with two
// values (400), a body over the limit (413, before it is read), a Transfer-Encoding (411:
// the body must come with its length), and a form-encoded or multipart body (415: every
// POST route takes JSON).
Framing frame_request(std::string_view bytes, const FramingLimits& limits);

}  // namespace kvevict::server
