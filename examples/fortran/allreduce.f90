! All-reduce from Fortran with `use mpi`: a communicator made straight from MPI_COMM_WORLD
! through the ferroccl module, then a sum over double precision host arrays.
program allreduce_f
  use mpi
  use ferroccl
  use iso_c_binding
  implicit none
  integer :: ierr, rank, nranks, i, wrong, total
  integer(c_int) :: res
  type(c_ptr) :: comm
  integer(c_size_t), parameter :: n = 100000
  real(c_double), target :: x(n), y(n)

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)

  res = ferroccl_comm_init_mpi(comm, MPI_COMM_WORLD)
  if (res /= ncclSuccess) then
    print *, 'ferroccl_comm_init_mpi failed: ', res
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if

  do i = 1, int(n)
    x(i) = real(rank + 1, c_double) * real(mod(i, 7), c_double)
  end do
  res = ncclAllReduce(c_loc(x), c_loc(y), n, ncclFloat64, ncclSum, comm, c_null_ptr)
  if (res /= ncclSuccess) then
    print *, 'ncclAllReduce failed: ', res
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if

  wrong = 0
  do i = 1, int(n)
    if (y(i) /= real(nranks * (nranks + 1) / 2, c_double) * real(mod(i, 7), c_double)) wrong = wrong + 1
  end do
  call MPI_Allreduce(wrong, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) then
    if (total == 0) then
      print '(a,i0,a)', 'allreduce.f90 (use mpi): ', nranks, ' ranks: OK'
    else
      print '(a,i0,a)', 'allreduce.f90 (use mpi): FAILED, ', total, ' wrong'
    end if
  end if
  res = ncclCommDestroy(comm)
  call MPI_Finalize(ierr)
  if (total /= 0) stop 1
end program allreduce_f
