#include "harness/server/connection_gate.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <vector>

#include "harness/server/request.h"

namespace kvevict::server {
namespace {

using Clock = std::chrono::steady_clock;

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

// Writes what the socket takes now; a refusal is small enough for any send buffer.
void send_now(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) sent += static_cast<size_t>(n);
    else if (n < 0 && errno == EINTR) continue;
    else break;
  }
}

std::string seconds_text(int ms) {
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

void watch(int epoll_fd, int fd) {
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP;
  event.data.fd = fd;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
}

}  // namespace

ConnectionGate::ConnectionGate(GateOptions options, OnRequest on_request, OnRefusal on_refusal)
    : options_(options), on_request_(std::move(on_request)), on_refusal_(std::move(on_refusal)) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const int error = errno;
    ::close(epoll_fd_);
    throw std::system_error(error, std::generic_category(), "eventfd");
  }
  watch(epoll_fd_, wake_fd_);
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (...) {
    ::close(wake_fd_);
    ::close(epoll_fd_);
    throw;
  }
}

ConnectionGate::~ConnectionGate() {
  stop();
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

void ConnectionGate::send_refusal(int fd, int status, const std::string& message) {
  const std::string type = status >= 500 ? "server_error" : "invalid_request_error";
  const std::string body =
      error_json(RequestError(status, message, "", type)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  send_now(fd, "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
                   "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                   "\r\nConnection: close\r\n\r\n" + body);
}

void ConnectionGate::adopt(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) {
    ::close(fd);
    return;
  }
  if (static_cast<int>(connections_.size()) >= options_.max_connections) {
    lock.unlock();
    const std::string message = "the server holds " + std::to_string(options_.max_connections) +
                                " connections, its limit (--max-connections); retry later";
    send_refusal(fd, 503, message);
    ::close(fd);
    on_refusal_(GateRefusal{"", "", 503, message});
    return;
  }
  Connection& connection = connections_[fd];
  connection.deadline = Clock::now() + std::chrono::milliseconds(options_.request_timeout_ms);
  watch(epoll_fd_, fd);
  lock.unlock();
  wake();
}

void ConnectionGate::resume(int fd, bool keep_open) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  if (!keep_open || stopping_ || it->second.peer_done) {
    close_connection(fd);
    return;
  }
  Connection& connection = it->second;
  connection.phase = Phase::Reading;
  connection.request_started = !connection.buffer.empty();
  connection.deadline = Clock::now() + std::chrono::milliseconds(connection.request_started ? options_.request_timeout_ms
                                                                                            : options_.keep_alive_ms);
  watch(epoll_fd_, fd);
  if (connection.request_started) advance(fd, connection, lock);  // a pipelined request
  if (lock.owns_lock()) lock.unlock();
  wake();
}

void ConnectionGate::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->second.phase == Phase::WithWorker) {
        ++it;
        continue;
      }
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->first, nullptr);
      ::close(it->first);
      it = connections_.erase(it);
    }
  }
  wake();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void ConnectionGate::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = ::write(wake_fd_, &one, sizeof one);
}

void ConnectionGate::close_connection(int fd) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  connections_.erase(fd);
}

void ConnectionGate::loop() {
  std::vector<epoll_event> events(64);
  for (;;) {
    int timeout = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      timeout = wait_ms(Clock::now());
    }
    const int ready = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    for (int i = 0; i < ready; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t count = 0;
        [[maybe_unused]] const ssize_t got = ::read(wake_fd_, &count, sizeof count);
        continue;
      }
      read_from(fd);
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) return;
    expire(Clock::now(), lock);
  }
}

int ConnectionGate::wait_ms(Clock::time_point now) const {
  auto soonest = now + std::chrono::seconds(1);
  for (const auto& [fd, connection] : connections_)
    if (connection.phase != Phase::WithWorker && connection.deadline < soonest) soonest = connection.deadline;
  return static_cast<int>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(soonest - now).count() + 1));
}

void ConnectionGate::read_from(int fd) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.phase == Phase::WithWorker) return;
  Connection& connection = it->second;
  // At most this much per wake-up, so one fast sender cannot starve the others.
  constexpr size_t kReadPerWake = 256 << 10;
  const size_t most = static_cast<size_t>(options_.framing.max_head_bytes + options_.framing.max_body_bytes) + 4096;
  char chunk[16384];
  size_t taken = 0;
  bool peer_done = false;
  while (taken < kReadPerWake) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n > 0) {
      taken += static_cast<size_t>(n);
      if (connection.phase == Phase::Draining) continue;
      connection.buffer.append(chunk, static_cast<size_t>(n));
      if (connection.buffer.size() > most) break;  // enough to decide: framing refuses or completes
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    peer_done = true;  // end of input (or a failed socket): what came may still be whole
    break;
  }
  if (peer_done) {
    // A client may send its request and shut its side at once: that request is answered.
    const Framing framing = connection.phase == Phase::Reading ? frame_request(connection.buffer, options_.framing)
                                                               : Framing{};
    if (framing.state != Framing::State::Complete) {
      close_connection(fd);
      return;
    }
    connection.peer_done = true;
  }
  if (connection.phase == Phase::Draining || connection.buffer.empty()) return;
  if (!connection.request_started) {
    connection.request_started = true;
    connection.deadline = Clock::now() + std::chrono::milliseconds(options_.request_timeout_ms);
  }
  advance(fd, connection, lock);
}

void ConnectionGate::advance(int fd, Connection& connection, std::unique_lock<std::mutex>& lock) {
  const Framing framing = frame_request(connection.buffer, options_.framing);
  connection.buffer.erase(0, framing.skipped);
  switch (framing.state) {
    case Framing::State::NeedMore:
      if (framing.expects_continue && !connection.continue_sent) {
        send_now(fd, "HTTP/1.1 100 Continue\r\n\r\n");
        connection.continue_sent = true;
      }
      return;
    case Framing::State::Refused:
      refuse(fd, connection, framing, framing.status, framing.message, lock);
      return;
    case Framing::State::Complete: {
      std::string request = connection.buffer.substr(0, framing.request_bytes);
      connection.buffer.erase(0, framing.request_bytes);
      connection.phase = Phase::WithWorker;
      connection.continue_sent = false;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      // The worker may resume the connection before on_request returns: `connection` is
      // not touched after this.
      lock.unlock();
      on_request_(fd, std::move(request));
      return;
    }
  }
}

void ConnectionGate::refuse(int fd, Connection& connection, const Framing& framing, int status,
                            const std::string& message, std::unique_lock<std::mutex>& lock) {
  send_refusal(fd, status, message);
  // Unread input is read and dropped for a while: closing on it would reset the
  // connection, and the client could lose the answer.
  ::shutdown(fd, SHUT_WR);
  connection.phase = Phase::Draining;
  connection.buffer.clear();
  connection.deadline = Clock::now() + std::chrono::milliseconds(options_.drain_ms);
  const GateRefusal refusal{framing.method, framing.target, status, message};
  lock.unlock();
  on_refusal_(refusal);
}

void ConnectionGate::expire(Clock::time_point now, std::unique_lock<std::mutex>& lock) {
  std::vector<int> due;
  for (const auto& [fd, connection] : connections_)
    if (connection.phase != Phase::WithWorker && connection.deadline <= now) due.push_back(fd);
  for (int fd : due) {
    if (!lock.owns_lock()) lock.lock();
    auto it = connections_.find(fd);
    if (it == connections_.end() || it->second.phase == Phase::WithWorker || it->second.deadline > now) continue;
    Connection& connection = it->second;
    if (connection.phase == Phase::Reading && connection.request_started) {
      const Framing framing = frame_request(connection.buffer, options_.framing);
      std::string what = framing.head_bytes == 0
                             ? "its head came only in part (" + std::to_string(connection.buffer.size()) + " bytes)"
                             : "its body came only in part (" +
                                   std::to_string(connection.buffer.size() - framing.head_bytes) + " of " +
                                   std::to_string(framing.content_length) + " bytes)";
      refuse(fd, connection, framing, 408,
             "the request did not arrive whole within " + seconds_text(options_.request_timeout_ms) +
                 " (--request-timeout): " + what,
             lock);
    } else {
      close_connection(fd);  // idle between requests, or done draining
    }
  }
  if (lock.owns_lock()) lock.unlock();
}

}  // namespace kvevict::server
