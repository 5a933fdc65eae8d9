// The names of tuttid's I/O backends, the values `io.backend` takes: one list, which config
// validates against and io_factory.cc's table of factories follows (it checks so at compile time).
#ifndef TUTTI_DAEMON_IO_BACKEND_NAMES_H_
#define TUTTI_DAEMON_IO_BACKEND_NAMES_H_

#include <array>
#include <string_view>

namespace tutti::io {

inline constexpr std::array<std::string_view, 5> kBackendNames = {"uring", "memory", "gds",
                                                                  "uring_cmd", "nvme"};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_BACKEND_NAMES_H_
