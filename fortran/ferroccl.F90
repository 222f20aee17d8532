!> Fortran bindings for ferroccl (NCCL's host API, drop-in libnccl.so.2).
!>
!> Module `ferroccl`: `bind(C)` interfaces for every host function of NCCL 2.27's nccl.h plus
!> ferroccl's additions (ncclSetEncryption, ferrocclCommInitMpi[Config]), NCCL's constants and
!> the interoperable types ncclUniqueId, ncclConfig_t, ncclSimInfo_t, ncclEncryptionConfig_t.
!>
!> Conventions (same as the C API):
!>   * communicators, streams, windows and buffers are `type(c_ptr)` passed by value
!>     (buffers: `c_loc(array)`; the default stream: `c_null_ptr`);
!>   * counts are `integer(c_size_t)`, enums (ncclResult_t, ncclDataType_t, ncclRedOp_t, ...)
!>     are `integer(c_int)`; every function returns an ncclResult_t as `integer(c_int)`;
!>   * a C pointer argument that may be NULL is an OPTIONAL dummy (Fortran 2018 / TS 29113):
!>     leave it out to pass NULL (e.g. the config of ncclCommInitRankConfig).
!>
!> MPI: `ferroccl_comm_init_mpi(comm, mpi_comm [, config])` accepts the INTEGER handle of
!> `use mpi` / mpif.h, or a `type(MPI_Comm)` of `use mpi_f08`. The mpi_f08 specific needs
!> `use mpi_f08` here, so this file is preprocessed (.F90): compile it with the MPI Fortran
!> compiler (mpif90), or with -DFERROCCL_NO_MPI_F08 to build without mpi_f08 (the INTEGER
!> specific stays available; it needs no MPI module).
!>
!> The compiled .mod is compiler specific: the CMake package (ferroccl::fortran) compiles this
!> source inside the consumer's build; `make install` also installs a .mod and
!> libferroccl_fortran.a built with the compiler found at install time.
!>
!> Keep the constants in sync with include/nccl.h: tests/packaging/test-fortran.sh compares
!> every constant and struct layout against the C header.
module ferroccl
  use, intrinsic :: iso_c_binding
#ifndef FERROCCL_NO_MPI_F08
  use mpi_f08, only: MPI_Comm
#endif
  implicit none
  private :: c_strlen

  ! ---------------------------------------------------------------- version
  integer(c_int), parameter :: NCCL_MAJOR = 2
  integer(c_int), parameter :: NCCL_MINOR = 27
  integer(c_int), parameter :: NCCL_PATCH = 7
  !> NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH); minor > 8, so the X*10000 form.
  integer(c_int), parameter :: NCCL_VERSION_CODE = NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH
  integer(c_int), parameter :: FERROCCL_VERSION_MAJOR = 0
  integer(c_int), parameter :: FERROCCL_VERSION_MINOR = 1
  integer(c_int), parameter :: FERROCCL_VERSION_PATCH = 0

  ! ---------------------------------------------------------------- ncclResult_t
  integer(c_int), parameter :: ncclSuccess = 0
  integer(c_int), parameter :: ncclUnhandledCudaError = 1
  integer(c_int), parameter :: ncclSystemError = 2
  integer(c_int), parameter :: ncclInternalError = 3
  integer(c_int), parameter :: ncclInvalidArgument = 4
  integer(c_int), parameter :: ncclInvalidUsage = 5
  integer(c_int), parameter :: ncclRemoteError = 6
  integer(c_int), parameter :: ncclInProgress = 7
  integer(c_int), parameter :: ncclTimeout = 8
  integer(c_int), parameter :: ncclNumResults = 9

  ! ---------------------------------------------------------------- ncclDataType_t
  integer(c_int), parameter :: ncclInt8 = 0
  integer(c_int), parameter :: ncclChar = 0
  integer(c_int), parameter :: ncclUint8 = 1
  integer(c_int), parameter :: ncclInt32 = 2
  integer(c_int), parameter :: ncclInt = 2
  integer(c_int), parameter :: ncclUint32 = 3
  integer(c_int), parameter :: ncclInt64 = 4
  integer(c_int), parameter :: ncclUint64 = 5
  integer(c_int), parameter :: ncclFloat16 = 6
  integer(c_int), parameter :: ncclHalf = 6
  integer(c_int), parameter :: ncclFloat32 = 7
  integer(c_int), parameter :: ncclFloat = 7
  integer(c_int), parameter :: ncclFloat64 = 8
  integer(c_int), parameter :: ncclDouble = 8
  integer(c_int), parameter :: ncclBfloat16 = 9
  integer(c_int), parameter :: ncclFloat8e4m3 = 10
  integer(c_int), parameter :: ncclFloat8e5m2 = 11
  integer(c_int), parameter :: ncclNumTypes = 12

  ! ---------------------------------------------------------------- ncclRedOp_t
  integer(c_int), parameter :: ncclSum = 0
  integer(c_int), parameter :: ncclProd = 1
  integer(c_int), parameter :: ncclMax = 2
  integer(c_int), parameter :: ncclMin = 3
  integer(c_int), parameter :: ncclAvg = 4
  integer(c_int), parameter :: ncclNumOps = 5
  integer(c_int), parameter :: ncclMaxRedOp = 2147483647

  ! ---------------------------------------------------------------- ncclScalarResidence_t
  integer(c_int), parameter :: ncclScalarDevice = 0
  integer(c_int), parameter :: ncclScalarHostImmediate = 1

  ! ---------------------------------------------------------------- other constants
  integer(c_int), parameter :: NCCL_UNIQUE_ID_BYTES = 128
  !> INT_MIN, written without overflowing a literal.
  integer(c_int), parameter :: NCCL_CONFIG_UNDEF_INT = -huge(0_c_int) - 1_c_int
  integer(c_int), parameter :: NCCL_SPLIT_NOCOLOR = -1
  real(c_float), parameter :: NCCL_UNDEF_FLOAT = -1.0_c_float
  !> 0xcafebeef as the bit pattern of a C int (the C field is unsigned).
  integer(c_int), parameter :: NCCL_API_MAGIC = -889274641_c_int
  !> 0x74685283, the ncclSimInfo_t magic.
  integer(c_int), parameter :: NCCL_SIM_INFO_MAGIC = 1952993923_c_int
  integer(c_int), parameter :: NCCL_WIN_DEFAULT = 0
  integer(c_int), parameter :: NCCL_WIN_COLL_SYMMETRIC = 1
  integer(c_int), parameter :: NCCL_WIN_STRICT_ORDERING = 2
  integer(c_int), parameter :: NCCL_WIN_REQUIRED_ALIGNMENT = 4096
  integer(c_int), parameter :: NCCL_CTA_POLICY_DEFAULT = 0
  integer(c_int), parameter :: NCCL_CTA_POLICY_EFFICIENCY = 1
  integer(c_int), parameter :: NCCL_CTA_POLICY_ZERO = 2
  integer(c_int), parameter :: NCCL_SHRINK_DEFAULT = 0
  integer(c_int), parameter :: NCCL_SHRINK_ABORT = 1
  integer(c_int), parameter :: NCCL_ENCRYPTION_MODE_NONE = 0
  integer(c_int), parameter :: NCCL_ENCRYPTION_MODE_PSK = 1
  !> ncclEncryptionConfig_t magic (same as NCCL_API_MAGIC) and version (NCCL_VERSION(2,32,0)):
  !> the encryption API is NCCL 2.32's.
  integer(c_int), parameter :: NCCL_ENCRYPTION_CONFIG_MAGIC = NCCL_API_MAGIC
  integer(c_int), parameter :: NCCL_ENCRYPTION_CONFIG_VERSION = 2 * 10000 + 32 * 100 + 0

  ! ---------------------------------------------------------------- types
  !> 128 opaque bytes; broadcast `id%internal` (e.g. MPI_BYTE x 128) to form a communicator.
  type, bind(C) :: ncclUniqueId
    character(kind=c_char) :: internal(NCCL_UNIQUE_ID_BYTES)
  end type ncclUniqueId

  !> ncclConfig_t (ncclConfig_v23000, 96 bytes). Start from NCCL_CONFIG_INITIALIZER or
  !> ncclConfigInitializer(), then set the fields you need.
  type, bind(C) :: ncclConfig_t
    integer(c_size_t) :: size
    integer(c_int) :: magic        ! unsigned in C
    integer(c_int) :: version      ! unsigned in C
    integer(c_int) :: blocking
    integer(c_int) :: cgaClusterSize
    integer(c_int) :: minCTAs
    integer(c_int) :: maxCTAs
    type(c_ptr) :: netName         ! const char*
    integer(c_int) :: splitShare
    integer(c_int) :: trafficClass
    type(c_ptr) :: commName        ! const char*
    integer(c_int) :: collnetEnable
    integer(c_int) :: CTAPolicy
    integer(c_int) :: shrinkShare
    integer(c_int) :: nvlsCTAs
    integer(c_int) :: nChannelsPerNetPeer
    integer(c_int) :: nvlinkCentricSched
    integer(c_int) :: graphUsageMode
    integer(c_int) :: numRmaCtx
    integer(c_int) :: maxP2pPeers
    integer(c_int) :: graphStreamOrdering
  end type ncclConfig_t

  !> ncclSimInfo_t (24 bytes), for ncclGroupSimulateEnd.
  type, bind(C) :: ncclSimInfo_t
    integer(c_size_t) :: size
    integer(c_int) :: magic        ! unsigned in C
    integer(c_int) :: version      ! unsigned in C
    real(c_float) :: estimatedTime
  end type ncclSimInfo_t

  !> ncclEncryptionConfig_t (32 bytes), for ncclSetEncryption. `psk` is a NUL-terminated
  !> key of at least 32 bytes: `psk = c_loc(key)` with `key = '...' // c_null_char` (TARGET).
  type, bind(C) :: ncclEncryptionConfig_t
    integer(c_size_t) :: size
    integer(c_int) :: magic        ! unsigned in C
    integer(c_int) :: version      ! unsigned in C
    integer(c_int) :: mode
    type(c_ptr) :: psk             ! const char*
  end type ncclEncryptionConfig_t

  !> NCCL_CONFIG_INITIALIZER: every field undefined (library/env defaults).
  type(ncclConfig_t), parameter :: NCCL_CONFIG_INITIALIZER = ncclConfig_t( &
    size=96_c_size_t, magic=NCCL_API_MAGIC, version=NCCL_VERSION_CODE, &
    blocking=NCCL_CONFIG_UNDEF_INT, cgaClusterSize=NCCL_CONFIG_UNDEF_INT, &
    minCTAs=NCCL_CONFIG_UNDEF_INT, maxCTAs=NCCL_CONFIG_UNDEF_INT, netName=c_null_ptr, &
    splitShare=NCCL_CONFIG_UNDEF_INT, trafficClass=NCCL_CONFIG_UNDEF_INT, commName=c_null_ptr, &
    collnetEnable=NCCL_CONFIG_UNDEF_INT, CTAPolicy=NCCL_CONFIG_UNDEF_INT, &
    shrinkShare=NCCL_CONFIG_UNDEF_INT, nvlsCTAs=NCCL_CONFIG_UNDEF_INT, &
    nChannelsPerNetPeer=NCCL_CONFIG_UNDEF_INT, nvlinkCentricSched=NCCL_CONFIG_UNDEF_INT, &
    graphUsageMode=NCCL_CONFIG_UNDEF_INT, numRmaCtx=NCCL_CONFIG_UNDEF_INT, &
    maxP2pPeers=NCCL_CONFIG_UNDEF_INT, graphStreamOrdering=NCCL_CONFIG_UNDEF_INT)

  !> NCCL_SIM_INFO_INITIALIZER.
  type(ncclSimInfo_t), parameter :: NCCL_SIM_INFO_INITIALIZER = ncclSimInfo_t( &
    size=24_c_size_t, magic=NCCL_SIM_INFO_MAGIC, version=NCCL_VERSION_CODE, &
    estimatedTime=NCCL_UNDEF_FLOAT)

  !> NCCL_ENCRYPTION_CONFIG_INITIALIZER: mode NONE, no key.
  type(ncclEncryptionConfig_t), parameter :: NCCL_ENCRYPTION_CONFIG_INITIALIZER = &
    ncclEncryptionConfig_t(size=32_c_size_t, magic=NCCL_ENCRYPTION_CONFIG_MAGIC, &
    version=NCCL_ENCRYPTION_CONFIG_VERSION, mode=NCCL_ENCRYPTION_MODE_NONE, psk=c_null_ptr)

  ! ---------------------------------------------------------------- the C API
  interface
    ! -- memory
    function ncclMemAlloc(ptr, size) bind(C, name='ncclMemAlloc') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), intent(out) :: ptr
      integer(c_size_t), value :: size
      integer(c_int) :: res
    end function ncclMemAlloc

    function ncclMemFree(ptr) bind(C, name='ncclMemFree') result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: ptr
      integer(c_int) :: res
    end function ncclMemFree

    ! -- version, unique id
    function ncclGetVersion(version) bind(C, name='ncclGetVersion') result(res)
      import :: c_int
      integer(c_int), intent(out) :: version
      integer(c_int) :: res
    end function ncclGetVersion

    function ncclGetUniqueId(uniqueId) bind(C, name='ncclGetUniqueId') result(res)
      import :: ncclUniqueId, c_int
      type(ncclUniqueId), intent(out) :: uniqueId
      integer(c_int) :: res
    end function ncclGetUniqueId

    ! -- communicator creation
    function ncclCommInitRankConfig(comm, nranks, commId, rank, config) &
        bind(C, name='ncclCommInitRankConfig') result(res)
      import :: c_ptr, c_int, ncclUniqueId, ncclConfig_t
      type(c_ptr), intent(out) :: comm
      integer(c_int), value :: nranks
      type(ncclUniqueId), value :: commId
      integer(c_int), value :: rank
      type(ncclConfig_t), intent(in), optional :: config
      integer(c_int) :: res
    end function ncclCommInitRankConfig

    function ncclCommInitRank(comm, nranks, commId, rank) bind(C, name='ncclCommInitRank') &
        result(res)
      import :: c_ptr, c_int, ncclUniqueId
      type(c_ptr), intent(out) :: comm
      integer(c_int), value :: nranks
      type(ncclUniqueId), value :: commId
      integer(c_int), value :: rank
      integer(c_int) :: res
    end function ncclCommInitRank

    !> comms(ndev); devlist(ndev) or absent (devices 0..ndev-1).
    function ncclCommInitAll(comms, ndev, devlist) bind(C, name='ncclCommInitAll') result(res)
      import :: c_ptr, c_int
      type(c_ptr), intent(out) :: comms(*)
      integer(c_int), value :: ndev
      integer(c_int), intent(in), optional :: devlist(*)
      integer(c_int) :: res
    end function ncclCommInitAll

    function ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config) &
        bind(C, name='ncclCommInitRankScalable') result(res)
      import :: c_ptr, c_int, ncclUniqueId, ncclConfig_t
      type(c_ptr), intent(out) :: newcomm
      integer(c_int), value :: nranks
      integer(c_int), value :: myrank
      integer(c_int), value :: nId
      type(ncclUniqueId), intent(in) :: commIds(*)
      type(ncclConfig_t), intent(in), optional :: config
      integer(c_int) :: res
    end function ncclCommInitRankScalable

    ! -- communicator lifetime
    function ncclCommFinalize(comm) bind(C, name='ncclCommFinalize') result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      integer(c_int) :: res
    end function ncclCommFinalize

    function ncclCommDestroy(comm) bind(C, name='ncclCommDestroy') result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      integer(c_int) :: res
    end function ncclCommDestroy

    function ncclCommAbort(comm) bind(C, name='ncclCommAbort') result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      integer(c_int) :: res
    end function ncclCommAbort

    function ncclCommSplit(comm, color, key, newcomm, config) bind(C, name='ncclCommSplit') &
        result(res)
      import :: c_ptr, c_int, ncclConfig_t
      type(c_ptr), value :: comm
      integer(c_int), value :: color
      integer(c_int), value :: key
      type(c_ptr), intent(out) :: newcomm
      type(ncclConfig_t), intent(in), optional :: config
      integer(c_int) :: res
    end function ncclCommSplit

    function ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, &
        shrinkFlags) bind(C, name='ncclCommShrink') result(res)
      import :: c_ptr, c_int, ncclConfig_t
      type(c_ptr), value :: comm
      integer(c_int), intent(in), optional :: excludeRanksList(*)
      integer(c_int), value :: excludeRanksCount
      type(c_ptr), intent(out) :: newcomm
      type(ncclConfig_t), intent(in), optional :: config
      integer(c_int), value :: shrinkFlags
      integer(c_int) :: res
    end function ncclCommShrink

    ! -- errors and queries
    !> const char*: see nccl_error_string for a Fortran string.
    function ncclGetErrorString(code) bind(C, name='ncclGetErrorString') result(str)
      import :: c_ptr, c_int
      integer(c_int), value :: code
      type(c_ptr) :: str
    end function ncclGetErrorString

    !> const char*: see nccl_last_error for a Fortran string. comm may be c_null_ptr.
    function ncclGetLastError(comm) bind(C, name='ncclGetLastError') result(str)
      import :: c_ptr
      type(c_ptr), value :: comm
      type(c_ptr) :: str
    end function ncclGetLastError

    !> Re-reads NCCL_DEBUG / NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE on the next call.
    subroutine ncclResetDebugInit() bind(C, name='ncclResetDebugInit')
    end subroutine ncclResetDebugInit

    function ncclCommGetAsyncError(comm, asyncError) bind(C, name='ncclCommGetAsyncError') &
        result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      integer(c_int), intent(out) :: asyncError
      integer(c_int) :: res
    end function ncclCommGetAsyncError

    function ncclCommCount(comm, count) bind(C, name='ncclCommCount') result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      integer(c_int), intent(out) :: count
      integer(c_int) :: res
    end function ncclCommCount

    function ncclCommCuDevice(comm, device) bind(C, name='ncclCommCuDevice') result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      integer(c_int), intent(out) :: device
      integer(c_int) :: res
    end function ncclCommCuDevice

    function ncclCommUserRank(comm, rank) bind(C, name='ncclCommUserRank') result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      integer(c_int), intent(out) :: rank
      integer(c_int) :: res
    end function ncclCommUserRank

    ! -- buffer registration
    function ncclCommRegister(comm, buff, size, handle) bind(C, name='ncclCommRegister') &
        result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: comm
      type(c_ptr), value :: buff
      integer(c_size_t), value :: size
      type(c_ptr), intent(out) :: handle
      integer(c_int) :: res
    end function ncclCommRegister

    function ncclCommDeregister(comm, handle) bind(C, name='ncclCommDeregister') result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      type(c_ptr), value :: handle
      integer(c_int) :: res
    end function ncclCommDeregister

    function ncclCommWindowRegister(comm, buff, size, win, winFlags) &
        bind(C, name='ncclCommWindowRegister') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: comm
      type(c_ptr), value :: buff
      integer(c_size_t), value :: size
      type(c_ptr), intent(out) :: win
      integer(c_int), value :: winFlags
      integer(c_int) :: res
    end function ncclCommWindowRegister

    function ncclCommWindowDeregister(comm, win) bind(C, name='ncclCommWindowDeregister') &
        result(res)
      import :: c_ptr, c_int
      type(c_ptr), value :: comm
      type(c_ptr), value :: win
      integer(c_int) :: res
    end function ncclCommWindowDeregister

    ! -- custom reduction operators
    function ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm) &
        bind(C, name='ncclRedOpCreatePreMulSum') result(res)
      import :: c_ptr, c_int
      integer(c_int), intent(out) :: op
      type(c_ptr), value :: scalar
      integer(c_int), value :: datatype
      integer(c_int), value :: residence
      type(c_ptr), value :: comm
      integer(c_int) :: res
    end function ncclRedOpCreatePreMulSum

    function ncclRedOpDestroy(op, comm) bind(C, name='ncclRedOpDestroy') result(res)
      import :: c_ptr, c_int
      integer(c_int), value :: op
      type(c_ptr), value :: comm
      integer(c_int) :: res
    end function ncclRedOpDestroy

    ! -- collectives
    function ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream) &
        bind(C, name='ncclReduce') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      integer(c_int), value :: op
      integer(c_int), value :: root
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclReduce

    function ncclBcast(buff, count, datatype, root, comm, stream) bind(C, name='ncclBcast') &
        result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: buff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      integer(c_int), value :: root
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclBcast

    function ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream) &
        bind(C, name='ncclBroadcast') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      integer(c_int), value :: root
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclBroadcast

    function ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream) &
        bind(C, name='ncclAllReduce') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      integer(c_int), value :: op
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclAllReduce

    function ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream) &
        bind(C, name='ncclReduceScatter') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: recvcount
      integer(c_int), value :: datatype
      integer(c_int), value :: op
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclReduceScatter

    function ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) &
        bind(C, name='ncclAllGather') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: sendcount
      integer(c_int), value :: datatype
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclAllGather

    function ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream) &
        bind(C, name='ncclAlltoAll') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclAlltoAll

    function ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream) &
        bind(C, name='ncclGather') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      integer(c_int), value :: root
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclGather

    function ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream) &
        bind(C, name='ncclScatter') result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      integer(c_int), value :: root
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclScatter

    ! -- point to point
    function ncclSend(sendbuff, count, datatype, peer, comm, stream) bind(C, name='ncclSend') &
        result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: sendbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      integer(c_int), value :: peer
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclSend

    function ncclRecv(recvbuff, count, datatype, peer, comm, stream) bind(C, name='ncclRecv') &
        result(res)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      integer(c_int), value :: peer
      type(c_ptr), value :: comm
      type(c_ptr), value :: stream
      integer(c_int) :: res
    end function ncclRecv

    ! -- groups
    function ncclGroupStart() bind(C, name='ncclGroupStart') result(res)
      import :: c_int
      integer(c_int) :: res
    end function ncclGroupStart

    function ncclGroupEnd() bind(C, name='ncclGroupEnd') result(res)
      import :: c_int
      integer(c_int) :: res
    end function ncclGroupEnd

    function ncclGroupSimulateEnd(simInfo) bind(C, name='ncclGroupSimulateEnd') result(res)
      import :: c_int, ncclSimInfo_t
      type(ncclSimInfo_t), intent(inout), optional :: simInfo
      integer(c_int) :: res
    end function ncclGroupSimulateEnd

    ! -- encryption (ferroccl; NCCL 2.32 API). Absent config = plaintext.
    function ncclSetEncryption(config) bind(C, name='ncclSetEncryption') result(res)
      import :: c_int, ncclEncryptionConfig_t
      type(ncclEncryptionConfig_t), intent(in), optional :: config
      integer(c_int) :: res
    end function ncclSetEncryption

    !> ferroccl: JSON report of the communicator's connections and their protection, written
    !> NUL-terminated into buf(len); too small a buffer gives ncclInvalidArgument. See
    !> ferroccl_encryption_report for a Fortran string.
    function ferrocclCommEncryptionReport(comm, buf, len) bind(C, name='ferrocclCommEncryptionReport') &
        result(res)
      import :: c_ptr, c_char, c_size_t, c_int
      type(c_ptr), value :: comm
      character(kind=c_char), intent(out) :: buf(*)
      integer(c_size_t), value :: len
      integer(c_int) :: res
    end function ferrocclCommEncryptionReport

    ! -- private helper
    function c_strlen(s) bind(C, name='strlen') result(n)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function c_strlen
  end interface

  !> ferroccl_comm_init_mpi(comm, mpi_comm [, config]): a communicator over the ranks of an
  !> MPI communicator (collective over it; MPI must be initialised). mpi_comm is the INTEGER
  !> handle of `use mpi` / mpif.h, or a type(MPI_Comm) of `use mpi_f08`.
  !> ferrocclCommInitMpi / ferrocclCommInitMpiConfig are the C functions (INTEGER handle).
  interface ferroccl_comm_init_mpi
    function ferrocclCommInitMpi(comm, fcomm) bind(C, name='ferrocclCommInitMpi') result(res)
      import :: c_ptr, c_int
      type(c_ptr), intent(out) :: comm
      integer(c_int), value :: fcomm     ! MPI_Fint
      integer(c_int) :: res
    end function ferrocclCommInitMpi

    function ferrocclCommInitMpiConfig(comm, fcomm, config) &
        bind(C, name='ferrocclCommInitMpiConfig') result(res)
      import :: c_ptr, c_int, ncclConfig_t
      type(c_ptr), intent(out) :: comm
      integer(c_int), value :: fcomm     ! MPI_Fint
      type(ncclConfig_t), intent(in) :: config
      integer(c_int) :: res
    end function ferrocclCommInitMpiConfig
#ifndef FERROCCL_NO_MPI_F08
    module procedure ferroccl_comm_init_mpi_f08
#endif
  end interface ferroccl_comm_init_mpi

contains

  !> NCCL_VERSION(x, y, z) of nccl.h.
  pure elemental function nccl_version(x, y, z) result(code)
    integer(c_int), intent(in) :: x, y, z
    integer(c_int) :: code
    if (x <= 2 .and. y <= 8) then
      code = x * 1000 + y * 100 + z
    else
      code = x * 10000 + y * 100 + z
    end if
  end function nccl_version

  !> A fresh NCCL_CONFIG_INITIALIZER.
  pure function ncclConfigInitializer() result(config)
    type(ncclConfig_t) :: config
    config = NCCL_CONFIG_INITIALIZER
  end function ncclConfigInitializer

  !> A fresh NCCL_SIM_INFO_INITIALIZER.
  pure function ncclSimInfoInitializer() result(info)
    type(ncclSimInfo_t) :: info
    info = NCCL_SIM_INFO_INITIALIZER
  end function ncclSimInfoInitializer

  !> A fresh NCCL_ENCRYPTION_CONFIG_INITIALIZER.
  pure function ncclEncryptionConfigInitializer() result(config)
    type(ncclEncryptionConfig_t) :: config
    config = NCCL_ENCRYPTION_CONFIG_INITIALIZER
  end function ncclEncryptionConfigInitializer

  !> Copies a NUL-terminated C string into a Fortran string ('' for NULL).
  function nccl_c_string(ptr) result(str)
    type(c_ptr), intent(in) :: ptr
    character(len=:), allocatable :: str
    character(kind=c_char), pointer :: chars(:)
    integer(c_size_t) :: n, i
    if (.not. c_associated(ptr)) then
      str = ''
      return
    end if
    n = c_strlen(ptr)
    call c_f_pointer(ptr, chars, [n])
    allocate(character(len=n) :: str)
    do i = 1, n
      str(i:i) = chars(i)
    end do
  end function nccl_c_string

  !> ncclGetErrorString(res) as a Fortran string.
  function nccl_error_string(res) result(str)
    integer(c_int), intent(in) :: res
    character(len=:), allocatable :: str
    str = nccl_c_string(ncclGetErrorString(res))
  end function nccl_error_string

  !> ncclGetLastError(comm) as a Fortran string; comm may be left out.
  function nccl_last_error(comm) result(str)
    type(c_ptr), intent(in), optional :: comm
    character(len=:), allocatable :: str
    if (present(comm)) then
      str = nccl_c_string(ncclGetLastError(comm))
    else
      str = nccl_c_string(ncclGetLastError(c_null_ptr))
    end if
  end function nccl_last_error

  !> ferrocclCommEncryptionReport as a Fortran string ('' and res /= ncclSuccess on error).
  function ferroccl_encryption_report(comm, res) result(report)
    type(c_ptr), intent(in) :: comm
    integer(c_int), intent(out), optional :: res
    character(len=:), allocatable :: report
    character(kind=c_char), allocatable, target :: buf(:)
    integer(c_size_t) :: n, i
    integer(c_int) :: r
    n = 65536
    allocate(buf(n))
    r = ferrocclCommEncryptionReport(comm, buf, n)
    if (r == ncclSuccess) then
      n = c_strlen(c_loc(buf))
      allocate(character(len=n) :: report)
      do i = 1, n
        report(i:i) = buf(i)
      end do
    else
      report = ''
    end if
    if (present(res)) res = r
  end function ferroccl_encryption_report

#ifndef FERROCCL_NO_MPI_F08
  !> ferroccl_comm_init_mpi for `use mpi_f08`: passes mpicomm%MPI_VAL (an MPI_Fint).
  function ferroccl_comm_init_mpi_f08(comm, mpicomm, config) result(res)
    type(c_ptr), intent(out) :: comm
    type(MPI_Comm), intent(in) :: mpicomm
    type(ncclConfig_t), intent(in), optional :: config
    integer(c_int) :: res
    if (present(config)) then
      res = ferrocclCommInitMpiConfig(comm, int(mpicomm%MPI_VAL, c_int), config)
    else
      res = ferrocclCommInitMpi(comm, int(mpicomm%MPI_VAL, c_int))
    end if
  end function ferroccl_comm_init_mpi_f08
#endif

end module ferroccl
