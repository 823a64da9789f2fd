# cmake -DSOURCE_DIR=<fa3 source> -P check_readme.cmake
# The README's examples must be those of examples/ verbatim (which the test
# consumer_find_package compiles and runs, and tests/python/test_examples.py runs), so
# the README never shows stale code.
file(READ "${SOURCE_DIR}/README.md" readme)
foreach(name IN ITEMS forward.cpp serve_decode.cpp serve_decode.py)
  file(READ "${SOURCE_DIR}/examples/${name}" example)
  string(FIND "${readme}" "${example}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md does not contain examples/${name} verbatim")
  endif()
endforeach()
