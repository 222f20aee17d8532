! The same with `use mpi_f08`: the ferroccl module accepts type(MPI_Comm), and the classic
! unique-id route is shown too (id from rank 0 via MPI_Bcast).
program allreduce_f08
  use mpi_f08
  use ferroccl
  use iso_c_binding
  implicit none
  integer :: rank, nranks, i, wrong, total
  integer(c_int) :: res
  type(c_ptr) :: comm, comm2
  type(ncclUniqueId) :: id
  integer(c_size_t), parameter :: n = 5000
  real(c_float), target :: x(n), y(n)

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)

  res = ferroccl_comm_init_mpi(comm, MPI_COMM_WORLD)
  if (res /= ncclSuccess) call MPI_Abort(MPI_COMM_WORLD, 1)

  if (rank == 0) res = ncclGetUniqueId(id)
  call MPI_Bcast(id, 128, MPI_BYTE, 0, MPI_COMM_WORLD)
  res = ncclCommInitRank(comm2, int(nranks, c_int), id, int(rank, c_int))
  if (res /= ncclSuccess) call MPI_Abort(MPI_COMM_WORLD, 2)

  do i = 1, int(n)
    x(i) = real(mod(i + rank, 11), c_float)
  end do
  res = ncclAllReduce(c_loc(x), c_loc(y), n, ncclFloat32, ncclMax, comm, c_null_ptr)
  wrong = 0
  if (res /= ncclSuccess) wrong = wrong + 1
  do i = 1, int(n)
    if (y(i) /= expected_max(i, nranks)) wrong = wrong + 1
  end do
  res = ncclAllReduce(c_loc(x), c_loc(y), n, ncclFloat32, ncclSum, comm2, c_null_ptr)
  do i = 1, int(n)
    if (y(i) /= expected_sum(i, nranks)) wrong = wrong + 1
  end do
  call MPI_Allreduce(wrong, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0) then
    if (total == 0) then
      print '(a,i0,a)', 'allreduce_f08.f90 (use mpi_f08): ', nranks, ' ranks: OK'
    else
      print '(a,i0,a)', 'allreduce_f08.f90 (use mpi_f08): FAILED, ', total, ' wrong'
    end if
  end if
  res = ncclCommDestroy(comm)
  res = ncclCommDestroy(comm2)
  call MPI_Finalize()
  if (total /= 0) stop 1
contains
  real(c_float) function expected_max(i, nr)
    integer, intent(in) :: i, nr
    integer :: r
    expected_max = 0
    do r = 0, nr - 1
      expected_max = max(expected_max, real(mod(i + r, 11), c_float))
    end do
  end function
  real(c_float) function expected_sum(i, nr)
    integer, intent(in) :: i, nr
    integer :: r
    expected_sum = 0
    do r = 0, nr - 1
      expected_sum = expected_sum + real(mod(i + r, 11), c_float)
    end do
  end function
end program allreduce_f08
