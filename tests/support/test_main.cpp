// Test main for every unit test: MPI, then the tests (the order main.cpp uses).
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  ::testing::InitGoogleTest(&argc, argv);
  rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
