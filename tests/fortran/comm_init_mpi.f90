! `use mpi` (INTEGER handles): ferroccl_comm_init_mpi(comm, MPI_COMM_WORLD), rank/size checks
! against MPI, a host-memory allreduce, destroy. Run under mpirun -np N.
program comm_init_mpi
  use, intrinsic :: iso_c_binding
  use mpi
  use ferroccl
  implicit none
  integer :: ierr, rank, size, bad, i
  integer(c_int) :: res, n, r
  type(c_ptr) :: comm
  real(c_double), target :: send(16), recv(16)

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, size, ierr)
  bad = 0

  res = ferroccl_comm_init_mpi(comm, MPI_COMM_WORLD)
  call nccl_check(res, 'ferroccl_comm_init_mpi(integer)')
  call nccl_check(ncclCommCount(comm, n), 'ncclCommCount')
  call nccl_check(ncclCommUserRank(comm, r), 'ncclCommUserRank')
  if (n /= size .or. r /= rank) then
    print '(a,4(1x,i0))', 'comm_init_mpi_f90: rank/size mismatch', r, n, rank, size
    bad = 1
  end if
  send = [(real((rank + 1) * i, c_double), i = 1, 16)]
  call nccl_check(ncclAllReduce(c_loc(send), c_loc(recv), 16_c_size_t, ncclFloat64, ncclSum, &
    comm, c_null_ptr), 'ncclAllReduce')
  do i = 1, 16
    if (recv(i) /= real(size * (size + 1) / 2 * i, c_double)) bad = 1
  end do
  call nccl_check(ncclCommDestroy(comm), 'ncclCommDestroy')
  call MPI_Allreduce(MPI_IN_PLACE, bad, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (bad == 0) print '(a,i0,a,i0,a)', 'comm_init_mpi_f90: rank ', rank, ' of ', size, ': ok'
  call MPI_Finalize(ierr)
  if (bad /= 0) error stop 1

contains

  subroutine nccl_check(res, what)
    integer(c_int), intent(in) :: res
    character(len=*), intent(in) :: what
    integer :: ierr2
    if (res /= ncclSuccess) then
      print '(a,i0,a)', 'comm_init_mpi_f90: rank ', rank, ': ' // what // ' failed: ' // &
        nccl_error_string(res) // ' (' // nccl_last_error() // ')'
      call MPI_Abort(MPI_COMM_WORLD, 1, ierr2)
    end if
  end subroutine nccl_check
end program comm_init_mpi
