#include <gtest/gtest.h>
TEST(Validate, Placeholder) {}
