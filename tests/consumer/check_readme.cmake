# cmake -DSOURCE_DIR=<fa3 source> -P check_readme.cmake
# The README's C++ example must be examples/forward.cpp verbatim (which the test
# consumer_find_package compiles and runs), so the README never shows stale code.
file(READ "${SOURCE_DIR}/README.md" readme)
file(READ "${SOURCE_DIR}/examples/forward.cpp" example)
string(FIND "${readme}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not contain examples/forward.cpp verbatim")
endif()
