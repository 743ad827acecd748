#include "harness/common/kill_points.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace kvevict {
namespace {

struct ArmedPoint {
  std::string name;
  long hit = 0;  // 0: nothing armed
  long seen = 0;
};

ArmedPoint& armed() {
  static ArmedPoint point = [] {
    ArmedPoint p;
    const char* spec = std::getenv("KVEVICT_KILL_POINT");
    if (!spec) return p;
    const char* colon = std::strrchr(spec, ':');
    if (!colon) return p;
    p.name.assign(spec, colon);
    p.hit = std::atol(colon + 1);
    return p;
  }();
  return point;
}

}  // namespace

bool kill_point_reached(const char* name) {
  ArmedPoint& point = armed();
  return point.hit > 0 && point.name == name && ++point.seen == point.hit;
}

void kill_now() {
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);  // not reached
}

}  // namespace kvevict
