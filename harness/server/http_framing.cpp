#include "harness/server/http_framing.h"

#include <cctype>

namespace kvevict::server {
namespace {

bool is_token_char(unsigned char c) {
  return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

bool istarts_with(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && iequals(text.substr(0, prefix.size()), prefix);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Framing refuse(Framing framing, int status, std::string message) {
  framing.state = Framing::State::Refused;
  framing.status = status;
  framing.message = std::move(message);
  return framing;
}

// METHOD SP request-target SP HTTP/1.x
bool parse_request_line(std::string_view line, Framing& framing) {
  const size_t first = line.find(' ');
  if (first == std::string_view::npos || first == 0) return false;
  const size_t second = line.find(' ', first + 1);
  if (second == std::string_view::npos || second == first + 1) return false;
  const std::string_view method = line.substr(0, first), target = line.substr(first + 1, second - first - 1),
                         version = line.substr(second + 1);
  for (unsigned char c : method)
    if (!is_token_char(c)) return false;
  for (unsigned char c : target)
    if (c <= 0x20 || c >= 0x7f) return false;
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return false;
  framing.method = std::string(method);
  framing.target = std::string(target.substr(0, 200));
  return true;
}

}  // namespace

std::string quoted_header_text(std::string_view text, size_t most) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < most; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (text.size() > most) out += "...";
  return out + "\"";
}

Framing frame_request(std::string_view bytes, const FramingLimits& limits) {
  Framing framing;
  while (framing.skipped < bytes.size()) {
    if (bytes[framing.skipped] == '\n') ++framing.skipped;
    else if (bytes.substr(framing.skipped, 2) == "\r\n") framing.skipped += 2;
    else if (bytes.substr(framing.skipped) == "\r") return framing;
    else break;
  }
  const std::string_view request = bytes.substr(framing.skipped);

  // The head, line by line (CRLF, or a bare LF as RFC 9112 2.2 allows a recipient to take).
  bool have_length = false, chunked = false, form = false, expects_continue = false;
  std::string_view content_type;
  int64_t content_length = 0;
  size_t at = 0;
  for (int line_index = 0;; ++line_index) {
    const size_t newline = request.find('\n', at);
    if (newline == std::string_view::npos) {
      if (request.size() > static_cast<size_t>(limits.max_head_bytes))
        return refuse(framing, 431,
                      "request head over " + std::to_string(limits.max_head_bytes) + " bytes without its end");
      return framing;
    }
    if (newline + 1 > static_cast<size_t>(limits.max_head_bytes))
      return refuse(framing, 431, "request head over " + std::to_string(limits.max_head_bytes) + " bytes");
    std::string_view line = request.substr(at, newline - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    at = newline + 1;
    if (line_index == 0) {
      if (!parse_request_line(line, framing))
        return refuse(framing, 400, "malformed request line " + quoted_header_text(line) + " (expected METHOD /path HTTP/1.1)");
      continue;
    }
    if (line.empty()) break;  // the head's end
    const size_t colon = line.find(':');
    if (line.front() == ' ' || line.front() == '\t')
      return refuse(framing, 400, "header line " + quoted_header_text(line) + " is folded (obsolete line folding is not accepted)");
    if (colon == std::string_view::npos || colon == 0)
      return refuse(framing, 400, "malformed header line " + quoted_header_text(line) + " (expected Name: value)");
    const std::string_view name = line.substr(0, colon), value = trim(line.substr(colon + 1));
    for (unsigned char c : name)
      if (!is_token_char(c)) return refuse(framing, 400, "malformed header name " + quoted_header_text(name));
    if (iequals(name, "Content-Length")) {
      bool digits = !value.empty();
      for (char c : value) digits = digits && c >= '0' && c <= '9';
      if (!digits) return refuse(framing, 400, "Content-Length " + quoted_header_text(value) + " is not a number of bytes");
      // Beyond 18 digits the count cannot fit a limit anyway: over the limit, not an overflow.
      int64_t length = 0;
      bool over = value.size() > 18;
      if (!over) {
        for (char c : value) length = length * 10 + (c - '0');
        over = length > limits.max_body_bytes;
      }
      if (over)
        return refuse(framing, 413,
                      "Content-Length " + quoted_header_text(value) + " exceeds the body limit of " +
                          std::to_string(limits.max_body_bytes) + " bytes (--max-body-bytes)");
      if (have_length && length != content_length)
        return refuse(framing, 400, "two Content-Length headers with different values");
      have_length = true;
      content_length = length;
    } else if (iequals(name, "Transfer-Encoding")) {
      chunked = true;
    } else if (iequals(name, "Content-Type")) {
      content_type = value;
      form = istarts_with(value, "application/x-www-form-urlencoded") || istarts_with(value, "multipart/form-data");
    } else if (iequals(name, "Expect")) {
      expects_continue = iequals(value, "100-continue");
    }
  }
  if (chunked)
    return refuse(framing, 411, "Transfer-Encoding is not accepted: send the body with a Content-Length header");
  if (form)
    return refuse(framing, 415,
                  "Content-Type " + quoted_header_text(content_type) + ": the body must be JSON (Content-Type: application/json)");
  framing.head_bytes = at;
  framing.content_length = content_length;
  const size_t whole = at + static_cast<size_t>(content_length);
  if (request.size() < whole) {
    framing.expects_continue = expects_continue;
    return framing;
  }
  framing.state = Framing::State::Complete;
  framing.request_bytes = whole;
  return framing;
}

}  // namespace kvevict::server
