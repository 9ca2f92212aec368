// The public header compiled as C++ (-std=c++11 -pedantic -Werror).
#include "test_header.c"
