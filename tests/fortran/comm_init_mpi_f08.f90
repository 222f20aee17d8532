! `use mpi_f08` (type(MPI_Comm) handles): ferroccl_comm_init_mpi(comm, MPI_COMM_WORLD), rank/size
! checks against MPI, a host-memory allreduce, destroy. Run under mpirun -np N.
program comm_init_mpi_f08
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use ferroccl
  implicit none
  integer :: rank, size, bad, i
  integer(c_int) :: res, n, r
  type(c_ptr) :: comm
  real(c_double), target :: send(16), recv(16)

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, size)
  bad = 0

  res = ferroccl_comm_init_mpi(comm, MPI_COMM_WORLD)
  call nccl_check(res, 'ferroccl_comm_init_mpi(type(MPI_Comm))')
  call nccl_check(ncclCommCount(comm, n), 'ncclCommCount')
  call nccl_check(ncclCommUserRank(comm, r), 'ncclCommUserRank')
  if (n /= size .or. r /= rank) then
    print '(a,4(1x,i0))', 'comm_init_mpi_f08: rank/size mismatch', r, n, rank, size
    bad = 1
  end if
  send = [(real((rank + 1) * i, c_double), i = 1, 16)]
  call nccl_check(ncclAllReduce(c_loc(send), c_loc(recv), 16_c_size_t, ncclFloat64, ncclSum, &
    comm, c_null_ptr), 'ncclAllReduce')
  do i = 1, 16
    if (recv(i) /= real(size * (size + 1) / 2 * i, c_double)) bad = 1
  end do
  call nccl_check(ncclCommDestroy(comm), 'ncclCommDestroy')
  call MPI_Allreduce(MPI_IN_PLACE, bad, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD)
  if (bad == 0) print '(a,i0,a,i0,a)', 'comm_init_mpi_f08: rank ', rank, ' of ', size, ': ok'
  call MPI_Finalize()
  if (bad /= 0) error stop 1

contains

  subroutine nccl_check(res, what)
    integer(c_int), intent(in) :: res
    character(len=*), intent(in) :: what
    if (res /= ncclSuccess) then
      print '(a,i0,a)', 'comm_init_mpi_f08: rank ', rank, ': ' // what // ' failed: ' // &
        nccl_error_string(res) // ' (' // nccl_last_error() // ')'
      call MPI_Abort(MPI_COMM_WORLD, 1)
    end if
  end subroutine nccl_check
end program comm_init_mpi_f08
