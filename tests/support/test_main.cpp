// Test main for every unit test: MPI, then the tests (the order main.cpp uses).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

int main(int argc, char** argv) {
  setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);  // as zero3d's main: no daemon for one process
  MPI_Init(&argc, &argv);
  int rc = 0;
  ::testing::InitGoogleTest(&argc, argv);
  rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
