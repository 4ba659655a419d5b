// The tessera binary: everything is in RunCli.
#include <iostream>

#include "tessera/cli/app.h"

int main(int argc, char** argv) { return tessera::cli::RunCli(argc, argv, std::cout, std::cerr); }
