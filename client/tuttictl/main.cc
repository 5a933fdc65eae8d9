// tuttictl: the operator's command-line tool for tuttid. See `tuttictl help`.
#include <iostream>
#include <string>
#include <vector>

#include "client/tuttictl/command.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return tutti::tuttictl::RunTuttictl(args, std::cout, std::cerr);
}
